"""JSON bodies in and out. Requests: JSON only, read with a size limit and a deadline, decoded into a
Struct, every failure an APIError (400, 408, 413, 415), never a 500. Responses: one JSON encoder."""

from __future__ import annotations

import logging
import re
from typing import Any, TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.access import escape
from api.errors import InvalidRequest, RequestTimeout, RequestTooLarge, UnsupportedMediaType

logger = logging.getLogger(__name__)

T = TypeVar("T")

_encoder = msgspec.json.Encoder()


class ParamError(ValueError):
    """A cross-field rule failed in __post_init__; param names the field, relative to the struct."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def encode(obj: Any) -> bytes:
    """JSON bytes of a response struct or plain value."""
    return _encoder.encode(obj)


def json_response(obj: object, status_code: int = 200) -> Response:
    return Response(encode(obj), status_code=status_code, media_type="application/json")

# "Expected `float` <= 2.0 - at `$.temperature`"; dict keys read "- at `key` in `$.logit_bias`".
_AT = re.compile(r" - at (?:`key` in )?`\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"^Object missing required field `(?P<field>[^`]+)`$")
_keys_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])


def require_json(request: Request) -> None:
    """415 unless the body is declared as JSON.

    A browser sends a cross-origin POST without asking first (no CORS preflight) only for
    text/plain, form and multipart bodies; refusing those keeps web pages from starting
    generations on a server without an API key.
    """
    declared = request.headers.get("content-type", "")
    if declared.partition(";")[0].strip().lower() != "application/json":
        shown = escape(declared[:60]) if declared else "none"
        raise UnsupportedMediaType(
            f"Unsupported Content-Type ({shown}): the request body must be JSON, sent with the header "
            "'Content-Type: application/json'.")


def require_json_from_browsers(request: Request, origins: list[str]) -> None:
    """Ollama's API reads any body as JSON: its clients, and `curl -d` in its documentation, send no JSON
    Content-Type. A browser always names the page's Origin on a cross-origin POST, so a body that is not
    declared as JSON is read as JSON unless a page from an origin outside CORS_ORIGINS sent it."""
    origin = request.headers.get("origin")
    if origin is None or "*" in origins or origin.rstrip("/") in origins:
        return
    require_json(request)


async def read_body(request: Request, limit: int, timeout: float) -> bytes:
    """The whole body, refusing with 413 as soon as it exceeds limit bytes, and 408 unless it all
    arrives within timeout seconds (a client trickling its body would otherwise hold the request)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(f"request body of {declared} bytes exceeds the limit of {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    try:
        with anyio.fail_after(timeout):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise RequestTooLarge(f"request body exceeds the limit of {limit} bytes")
                chunks.append(chunk)
    except TimeoutError:
        raise RequestTimeout(
            f"The request body did not arrive within {timeout:g} s (BODY_READ_TIMEOUT, {size} bytes received); "
            "send the whole body at once.") from None
    return b"".join(chunks)


def decode(body: bytes, decoder: msgspec.json.Decoder[T]) -> T:
    """Decode and validate body; any failure is an InvalidRequest whose param is msgspec's path."""
    try:
        value = decoder.decode(body)
    except msgspec.ValidationError as exc:
        message, param = explain(exc)
        raise InvalidRequest(message, param=param) from None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"Invalid JSON body: {exc}") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"Invalid JSON body: it is not valid UTF-8 (byte {exc.start}); encode it as UTF-8.") from None
    except RecursionError:
        raise InvalidRequest("Invalid JSON body: it is nested too deeply; flatten its arrays and objects.") from None
    if logger.isEnabledFor(logging.DEBUG):
        _log_unknown_fields(body, type(value))
    return value


def explain(exc: msgspec.ValidationError) -> tuple[str, str | None]:
    """An OpenAI-style message and the param ("messages[0].role") of a validation error."""
    text = str(exc)
    at = _AT.search(text)
    detail = text[: at.start()] if at else text
    path = at.group("path").replace("[...]", "").lstrip(".") if at else ""
    missing = _MISSING.match(detail)
    if missing:
        param = _join(path, missing.group("field"))
        return f"Missing required parameter: '{param}'.", param
    if isinstance(exc.__cause__, ParamError):
        path = _join(path, exc.__cause__.param)
    if not path:
        return f"Invalid request body: {detail}", None
    return f"Invalid value for '{path}': {detail}", path


def _join(path: str, field: str) -> str:
    return f"{path}.{field}" if path else field


def _log_unknown_fields(body: bytes, cls: type[msgspec.Struct]) -> None:
    unknown = sorted(set(_keys_decoder.decode(body)) - set(cls.__struct_fields__))
    if unknown:
        logger.debug("ignoring unknown fields of %s: %s", cls.__name__, escape(", ".join(unknown)))


async def read_request(request: Request, decoder: msgspec.json.Decoder[T], limit: int, timeout: float) -> T:
    """A generation endpoint's body: JSON only, within limit bytes and timeout seconds, decoded and validated."""
    require_json(request)
    return decode(await read_body(request, limit, timeout), decoder)


def check_message_count(count: int, limit: int, param: str = "messages") -> None:
    """The body limit bounds bytes; this bounds the chat template's work on rank 0 (MAX_MESSAGES).

    param names the list in the dialect's request: messages, or the Responses API's input (of items)."""
    if count > limit:
        noun = "messages" if param == "messages" else "items"
        raise InvalidRequest(f"Invalid value for '{param}': {count} {noun} exceed this server's limit of "
                             f"{limit} (MAX_MESSAGES).", param=param)
