"""An image's bytes -> the engine's canonical part: the format from its magic bytes, its size from its header,
truncated files, decompression bombs and the byte, pixel and count limits, each a 400 naming the field."""

from __future__ import annotations

import base64
import hashlib
import os
from urllib.parse import quote_from_bytes

import pytest

from api.errors import InvalidRequest
from api.images import ImageRef, resolve_images
from api.images.fetch import address_problem
from api.images.headers import ImageFormatError, read_header
from api.images.resolve import OFF_LOOP_BYTES
from config import load_settings
from tests.images import GIF, JPEG, PNG, WEBP, animated_gif, b64, data_url, image_file, noise_png, png_bomb

pytestmark = pytest.mark.anyio

FILES = {
    "png": (PNG, "image/png", 3, 2),
    "jpeg": (JPEG, "image/jpeg", 5, 4),
    "progressive jpeg": (image_file("JPEG", (33, 17), progressive=True), "image/jpeg", 33, 17),
    "webp": (WEBP, "image/webp", 7, 6),
    "lossless webp": (image_file("WEBP", (9, 8), lossless=True), "image/webp", 9, 8),
    "gif": (GIF, "image/gif", 2, 9),
    "animated gif": (animated_gif((4, 3)), "image/gif", 4, 3),
}


def settings(**overrides: object):
    environ = {"MODEL": "test-model", **{k: str(v) for k, v in overrides.items()}}
    return load_settings(environ=environ, env_file=os.devnull)


async def resolved(value: str, kind: str = "url", **overrides: object) -> dict:
    messages = [{"role": "user", "content": ["look", ImageRef(kind, value, "messages[0].content[1].image_url")]}]
    await resolve_images(messages, settings(**overrides))
    return messages[0]["content"][1]


async def refused(value: str, kind: str = "url", **overrides: object) -> str:
    with pytest.raises(InvalidRequest) as info:
        await resolved(value, kind, **overrides)
    assert info.value.status == 400 and info.value.param == "messages[0].content[1].image_url"
    return info.value.message


@pytest.mark.parametrize("name", sorted(FILES))
async def test_each_format_becomes_the_canonical_part_from_its_own_bytes(name):
    data, media_type, width, height = FILES[name]
    # the declared type is not trusted: every file is declared a PNG here
    part = await resolved(data_url(data, "image/png"))
    assert part == {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": media_type,
                    "width": width, "height": height, "data": data}


async def test_a_large_image_checked_on_a_worker_thread_gives_the_same_part():
    data = noise_png((400, 300))
    assert len(data) > OFF_LOOP_BYTES
    part = await resolved(b64(data), "base64")
    assert (part["width"], part["height"], part["data"]) == (400, 300, data)
    assert "truncated" in await refused(b64(data[:-1]), "base64")


@pytest.mark.parametrize("name", sorted(FILES))
def test_every_truncation_of_a_real_file_is_refused(name):
    data = FILES[name][0]
    for cut in range(len(data)):
        with pytest.raises(ImageFormatError, match="truncated|unsupported"):
            read_header(data[:cut])


@pytest.mark.parametrize("data", [image_file("BMP"), image_file("TIFF"), b"%PDF-1.7\n", b"hello"])
async def test_other_formats_are_unsupported(data):
    assert "unsupported image format" in await refused(data_url(data))


async def test_a_decompression_bomb_is_refused_from_its_header():
    bomb = png_bomb(50_000, 50_000)
    assert len(bomb) < 100
    message = await refused(data_url(bomb))
    assert "50000x50000 = 2500000000 pixels" in message and "MAX_IMAGE_PIXELS" in message


async def test_the_pixel_limit_is_a_setting():
    assert "MAX_IMAGE_PIXELS" in await refused(data_url(JPEG), MAX_IMAGE_PIXELS=19)  # 5x4
    assert (await resolved(data_url(JPEG), MAX_IMAGE_PIXELS=20))["width"] == 5


async def test_the_byte_limit_is_checked_before_and_after_base64_decoding():
    limit = len(PNG) - 1
    assert "MAX_IMAGE_BYTES" in await refused(data_url(PNG), MAX_IMAGE_BYTES=limit)
    assert "MAX_IMAGE_BYTES" in await refused("A" * 4000, "base64", MAX_IMAGE_BYTES=1000)  # never decoded
    assert (await resolved(data_url(PNG), MAX_IMAGE_BYTES=len(PNG)))["data"] == PNG


async def test_too_many_images_names_the_first_beyond_the_limit():
    refs = [ImageRef("base64", b64(PNG), f"messages[{i}].images[0]") for i in range(3)]
    messages = [{"role": "user", "content": [ref]} for ref in refs]
    with pytest.raises(InvalidRequest) as info:
        await resolve_images(messages, settings(MAX_IMAGES_PER_REQUEST=2))
    assert info.value.param == "messages[2].images[0]" and "MAX_IMAGES_PER_REQUEST" in info.value.message
    with pytest.raises(InvalidRequest, match="limit of 0"):
        await resolve_images([{"role": "user", "content": [refs[0]]}], settings(MAX_IMAGES_PER_REQUEST=0))


WRAPPED = {
    "url-safe": base64.urlsafe_b64encode(PNG).decode(),
    "unpadded": b64(PNG).rstrip("="),
    "in MIME lines": "\r\n".join(b64(PNG)[i:i + 76] for i in range(0, len(b64(PNG)), 76)),
}


@pytest.mark.parametrize("how", sorted(WRAPPED))
async def test_base64_as_clients_wrap_it(how):
    assert (await resolved(WRAPPED[how], "base64"))["data"] == PNG


@pytest.mark.parametrize("text", ["not base64!", "AAA=A", "é" * 8, "="])
async def test_base64_garbage_is_refused(text):
    assert "base64" in await refused(text, "base64")


async def test_a_percent_encoded_data_url_is_read():
    assert (await resolved("data:image/gif," + quote_from_bytes(GIF)))["data"] == GIF


@pytest.mark.parametrize(("url", "says"), [
    ("data:image/png;base64" + b64(PNG), "comma"),
    ("file:///etc/passwd", "data URL"),
    ("ftp://example.com/a.png", "data URL"),
    ("iVBORw0KGgo", "data URL"),
    ("https://example.com/a.png", "IMAGE_URL_FETCH=off"),
])
async def test_urls_other_than_data_are_refused_while_fetching_is_off(url, says):
    assert says in await refused(url)


@pytest.mark.parametrize(("address", "problem"), [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("::ffff:127.0.0.1", "loopback"),
    ("10.1.2.3", "private"), ("192.168.1.20", "private"), ("172.16.0.1", "private"), ("fd00::1", "private"),
    ("169.254.10.1", "link-local"), ("fe80::1%en0", "link-local"), ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"), ("240.0.0.1", "reserved"), ("0.0.0.0", "unspecified"),
    ("100.64.0.1", "non-public"), ("8.8.8.8", None), ("2606:4700:4700::1111", None),
])
def test_only_public_addresses_are_fetched_from(address, problem):
    found = address_problem(address)
    assert (found is None) if problem is None else (problem in found)


def test_loopback_is_allowed_only_by_the_hook_and_the_engines_hosts_never():
    assert address_problem("127.0.0.1", allow_loopback=True) is None
    assert address_problem("10.0.0.1", allow_loopback=True) == "a private address"
    assert "engine hosts" in address_problem("8.8.8.8", own=frozenset({"8.8.8.8"}))
