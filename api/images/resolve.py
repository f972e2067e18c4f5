"""Each ImageRef of a request becomes the engine's canonical image part, or a 400 naming its field.

The canonical part (placed where the image was among its message's parts):
    {"type": "image", "sha256": <hex of the file>, "media_type": "image/png", "width": int, "height": int,
     "data": <the file's bytes as sent>}
Limits (settings): MAX_IMAGES_PER_REQUEST counted before anything is decoded, MAX_IMAGE_BYTES before the base64
is decoded (from its length) and after, MAX_IMAGE_PIXELS from the header before any pixel is (decompression bombs).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from functools import partial
from typing import Any
from urllib.parse import unquote_to_bytes

import anyio
from starlette.requests import Request

from api.errors import InvalidRequest
from api.images.fetch import FetchRefused, fetch_image
from api.images.headers import ImageFormatError, read_header
from api.images.refs import ImageRef
from config import Settings
from ipc import test_hooks

# MCS_TEST_HOOKS=1 and this set to 1: image URLs on loopback are fetched (tests serve images from 127.0.0.1)
ALLOW_LOOPBACK_HOOK = "MCS_IMAGE_FETCH_ALLOW_LOOPBACK"
# images at least this large (as sent) are checked on a worker thread
OFF_LOOP_BYTES = 256 * 1024


async def take_images(request: Request, messages: list[dict[str, Any]], settings: Settings) -> None:
    """resolve_images for a route, keeping the field each image came in for the engine's errors (client_field)."""
    request.state.image_fields = await resolve_images(messages, settings)


def client_field(request: Request, param: str) -> str:
    """The field the client sent for the engine's name of an image part (messages[i].content[j]); else param."""
    fields = getattr(request.state, "image_fields", None) or {}
    return fields.get(param, param)


async def resolve_images(messages: list[dict[str, Any]], settings: Settings,
                         allow_loopback: bool | None = None) -> dict[str, str]:
    """Replace every ImageRef among messages' content parts with its canonical part; raises InvalidRequest.
    Returns each image's place as the engine names it (messages[i].content[j]) -> the client's field."""
    places = [(content, j, i) for i, m in enumerate(messages) if isinstance(content := m.get("content"), list)
              for j, part in enumerate(content) if isinstance(part, ImageRef)]
    limit = settings.MAX_IMAGES_PER_REQUEST
    if len(places) > limit:
        content, j, _ = places[limit]
        raise InvalidRequest(f"Invalid value for '{content[j].param}': the request carries {len(places)} images, "
                             f"more than this server's limit of {limit} (MAX_IMAGES_PER_REQUEST); send fewer.",
                             param=content[j].param)
    if allow_loopback is None:
        allow_loopback = test_hooks.hook(ALLOW_LOOPBACK_HOOK) == "1"
    fields = {}
    for content, j, i in places:
        fields[f"messages[{i}].content[{j}]"] = content[j].param
        content[j] = await _resolved(content[j], settings, allow_loopback)
    return fields


async def _resolved(ref: ImageRef, settings: Settings, allow_loopback: bool) -> dict[str, Any]:
    """The canonical part of ref; a large image is decoded and hashed on a worker thread (about 7 ms a MB here),
    so the event loop keeps every other stream moving."""
    if _is_http(ref):
        data = await _fetched(ref, settings, allow_loopback)
        size, work = len(data), partial(image_part, data, ref.param, settings)
    else:
        size, work = len(ref.value), partial(_inline_part, ref, settings)
    return work() if size < OFF_LOOP_BYTES else await anyio.to_thread.run_sync(work)


def image_part(data: bytes, param: str, settings: Settings) -> dict[str, Any]:
    """The canonical part of one image file; raises InvalidRequest naming param."""
    _check_size(len(data), param, settings)
    try:
        header = read_header(data)
    except ImageFormatError as exc:
        raise InvalidRequest(f"Invalid value for '{param}': {exc}.", param=param) from None
    pixels = header.width * header.height
    if pixels > settings.MAX_IMAGE_PIXELS:
        raise InvalidRequest(f"Invalid value for '{param}': the image declares {header.width}x{header.height} = "
                             f"{pixels} pixels, more than this server's limit of {settings.MAX_IMAGE_PIXELS} "
                             "(MAX_IMAGE_PIXELS); scale it down.", param=param)
    return {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": header.media_type,
            "width": header.width, "height": header.height, "data": data}


def _inline_part(ref: ImageRef, settings: Settings) -> dict[str, Any]:
    return image_part(_inline_bytes(ref, settings), ref.param, settings)


def _is_http(ref: ImageRef) -> bool:
    return ref.kind == "url" and ref.value[:8].lower().startswith(("http://", "https://"))


def _inline_bytes(ref: ImageRef, settings: Settings) -> bytes:
    """The file of a data URL or bare base64; any other URL is refused here."""
    if ref.value[:5].lower() == "data:":
        return _data_url(ref.value, ref.param, settings)
    if ref.kind == "base64":
        return _base64(ref.value, ref.param, settings)
    raise InvalidRequest(f"Invalid value for '{ref.param}': expected a data URL (data:image/png;base64,...) or an "
                         "http(s) URL.", param=ref.param)


async def _fetched(ref: ImageRef, settings: Settings, allow_loopback: bool) -> bytes:
    if settings.IMAGE_URL_FETCH != "on":
        raise InvalidRequest(f"Invalid value for '{ref.param}': this server does not fetch image URLs "
                             "(IMAGE_URL_FETCH=off); send the image inline as a data URL "
                             "(data:image/png;base64,...).", param=ref.param)
    try:
        return await fetch_image(ref.value, max_bytes=settings.MAX_IMAGE_BYTES, timeout=settings.IMAGE_URL_TIMEOUT,
                                 allow_loopback=allow_loopback, own_hosts=settings.hosts)
    except FetchRefused as exc:
        raise InvalidRequest(f"Invalid value for '{ref.param}': {exc}.", param=ref.param) from None


def _data_url(value: str, param: str, settings: Settings) -> bytes:
    """data:[<media type>][;base64],<data>; the declared type is not trusted (the bytes say what they are)."""
    header, comma, payload = value[5:].partition(",")
    if not comma:
        raise InvalidRequest(f"Invalid value for '{param}': a data URL needs a comma before its data "
                             "(data:image/png;base64,...).", param=param)
    if header.lower().endswith(";base64"):
        return _base64(payload, param, settings)
    _check_size(len(payload) // 3, param, settings)  # percent-encoding takes at most 3 characters a byte
    return unquote_to_bytes(payload)


def _base64(text: str, param: str, settings: Settings) -> bytes:
    """Standard or URL-safe base64, padded or not, wrapped or not; its length is checked before decoding."""
    if any(c in text for c in " \t\r\n"):
        text = "".join(text.split())
    _check_size(len(text) * 3 // 4 - 2, param, settings)
    altchars = b"-_" if "-" in text or "_" in text else None
    try:
        data = base64.b64decode(text + "=" * (-len(text) % 4), altchars=altchars, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"Invalid value for '{param}': the image is not valid base64; encode the file's "
                             "bytes with base64.", param=param) from None
    if not data:
        raise InvalidRequest(f"Invalid value for '{param}': the image is empty.", param=param)
    return data


def _check_size(size: int, param: str, settings: Settings) -> None:
    if size > settings.MAX_IMAGE_BYTES:
        raise InvalidRequest(f"Invalid value for '{param}': the image has {size} bytes or more, more than this "
                             f"server's limit of {settings.MAX_IMAGE_BYTES} (MAX_IMAGE_BYTES); send a smaller "
                             "or more compressed image.", param=param)
