"""Anthropic's error envelope for the gateway's one error hierarchy: same status, Anthropic's type names."""

from __future__ import annotations

from typing import Any

from api.errors import APIError

# HTTP status -> Anthropic's error type; statuses stay those of api/errors.py
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}


# the engine's names for what an Anthropic request calls otherwise (api/spelling.py)
ENGINE_NAMES = [
    (r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].input_schema"),
    (r"tools\[(\d+)\]\.function\.name", r"tools[\1].name"),
    ("stop", "stop_sequences"),
    ("response_format", "output_config.format"),
]


def error_type(err: APIError) -> str:
    if err.status in _TYPES:
        return _TYPES[err.status]
    return "invalid_request_error" if err.status < 500 else "api_error"


def error_body(err: APIError) -> dict[str, Any]:
    """{"type": "error", "error": {"type", "message"}}, the body of an answer and of a stream's error event."""
    return {"type": "error", "error": {"type": error_type(err), "message": err.message}}
