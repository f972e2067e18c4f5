"""The gateway's error hierarchy: each class is one OpenAI error object with its HTTP status."""

from __future__ import annotations

from typing import Any

import ipc


class APIError(Exception):
    """Base of every error the gateway answers with; rendered as {"error": {...}}."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None
    retry_after: int | None = None
    # the engine's refusal, which names OpenAI chat's parameters (api/spelling.py gives a dialect's names)
    from_engine: bool = False

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        """The OpenAI error object."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    @property
    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}


class InvalidRequest(APIError):
    status = 400
    type = "invalid_request_error"


class ContextLengthExceeded(InvalidRequest):
    code = "context_length_exceeded"


class Unauthorized(APIError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"

    @property
    def headers(self) -> dict[str, str]:
        return {"WWW-Authenticate": "Bearer"}


class Forbidden(APIError):
    """A valid key that may not read this route (a tenant's key on an operator's route)."""

    status = 403
    type = "permission_error"
    code = "operator_key_required"


class NotFound(APIError):
    status = 404
    type = "invalid_request_error"


class ModelNotFound(NotFound):
    code = "model_not_found"


class MethodNotAllowed(APIError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class RequestTimeout(APIError):
    """The body did not arrive in time; the rest of it may still come, so the connection is closed."""

    status = 408
    type = "invalid_request_error"
    code = "request_timeout"

    @property
    def headers(self) -> dict[str, str]:
        return {"Connection": "close"}


class RequestTooLarge(APIError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class UnsupportedMediaType(APIError):
    status = 415
    type = "invalid_request_error"
    code = "unsupported_media_type"


class NotSupported(APIError):
    """An endpoint of a dialect this server answers on purpose without serving it (Ollama's model management)."""

    status = 501
    type = "invalid_request_error"
    code = "not_supported"


class Overloaded(APIError):
    # OpenAI's request-rate limit: clients retry on this type and code after Retry-After
    status = 429
    type = "requests"
    code = "rate_limit_exceeded"
    retry_after = 1


class GenerationFailed(APIError):
    status = 500
    type = "server_error"
    code = "generation_failed"


class TooManyConnections(APIError):
    status = 503
    type = "server_error"
    code = "too_many_connections"
    retry_after = 1


class EngineUnavailable(APIError):
    status = 503
    type = "server_error"
    code = "engine_unavailable"
    retry_after = 5


class GenerationTimeout(GenerationFailed):
    status = 504
    code = "timeout"


_BY_STATUS: dict[int, type[APIError]] = {
    400: InvalidRequest,
    404: NotFound,
    408: RequestTimeout,
    413: RequestTooLarge,
    429: Overloaded,
    500: GenerationFailed,
    503: EngineUnavailable,
    504: GenerationTimeout,
}


def from_wire(err: ipc.Error) -> APIError:
    """Rebuild the class the engine meant from its Error frame (status, then code)."""
    if err.status == 400 and err.code == ContextLengthExceeded.code:
        cls: type[APIError] = ContextLengthExceeded
    elif err.status == 404 and err.code == ModelNotFound.code:
        cls = ModelNotFound
    else:
        cls = _BY_STATUS.get(err.status, GenerationFailed)
    # a 429 keeps OpenAI's code whatever the engine's reason (queue_full); its message says which
    code = None if cls is Overloaded else err.code
    exc = cls(err.message, param=err.param, code=code)
    exc.from_engine = True
    return exc
