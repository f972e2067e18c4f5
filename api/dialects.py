"""Which dialect a path speaks: its error envelope and its names for the engine's parameters. The app's error
handler and the HTTP server's own answers (a header timeout, too many connections) both ask here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from api.anthropic.errors import ENGINE_NAMES as ANTHROPIC_NAMES
from api.anthropic.errors import error_body as anthropic_error_body
from api.errors import APIError
from api.ollama.render import ENGINE_NAMES as OLLAMA_NAMES
from api.ollama.render import GENERATE_NAMES as OLLAMA_GENERATE_NAMES
from api.ollama.render import error_body as ollama_error_body
from api.responses.render import ENGINE_NAMES as RESPONSES_NAMES
from api.spelling import Names, respell

Envelope = Callable[[APIError], dict[str, Any]]

# by path prefix, the first that matches; everything else speaks OpenAI's chat
DIALECTS: list[tuple[str, Envelope, Names]] = [
    ("/v1/messages", anthropic_error_body, ANTHROPIC_NAMES),
    ("/v1/responses", APIError.body, RESPONSES_NAMES),
    ("/api/generate", ollama_error_body, OLLAMA_GENERATE_NAMES),
    ("/api/", ollama_error_body, OLLAMA_NAMES),
]


def error_body(err: APIError, path: str) -> dict[str, Any]:
    """err's body as the dialect of path writes it, in its names."""
    for prefix, envelope, names in DIALECTS:
        if path.startswith(prefix):
            return envelope(respell(err, names))
    return APIError.body(err)
