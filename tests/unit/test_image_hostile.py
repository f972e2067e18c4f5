"""Hostile images in every dialect: random bytes, truncated and damaged real files, absurd declared sizes,
base64 and URL garbage, too many images. Each request is taken or gets a 4xx naming the image's field; never
a 5xx."""

from __future__ import annotations

import base64
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.images import GIF, JPEG, PNG, WEBP, image_file, png_bomb

pytestmark = pytest.mark.anyio

SAFE = settings(max_examples=150, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
REAL = [PNG, JPEG, WEBP, GIF, image_file("JPEG", (40, 30), progressive=True)]


def _flip(data: bytes, at: int, bit: int) -> bytes:
    at %= len(data)
    return data[:at] + bytes([data[at] ^ (1 << bit)]) + data[at + 1:]


files = st.one_of(
    st.sampled_from(REAL),
    st.binary(max_size=64),
    st.builds(lambda data, cut: data[:cut % len(data)], st.sampled_from(REAL), st.integers(0, 10**6)),
    st.builds(_flip, st.sampled_from(REAL), st.integers(0, 10**6), st.integers(0, 7)),
    st.builds(png_bomb, st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)),
)
# what travels as an image's text: its file as base64, or garbage where base64 or a URL belongs
encoded = st.one_of(files.map(lambda data: base64.b64encode(data).decode()), st.text(max_size=24),
                    st.sampled_from(["", "=", "data:", "data:,", "data:image/png;base64,", "http://", "https://[::1",
                                     "http://127.0.0.1:1/x.png", "file:///etc/passwd", "javascript:alert(1)"]))


def _body(dialect: str, images: list[str]) -> tuple[str, dict[str, Any], list[str]]:
    """The request carrying images in dialect's shape, and each image's field as the error must name it."""
    if dialect == "openai":
        parts = [{"type": "image_url", "image_url": {"url": i if i.startswith(("data:", "http")) else
                                                     f"data:image/png;base64,{i}"}} for i in images]
        return "/v1/chat/completions", {"model": "test-model", "messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}, *parts]}]}, [f"messages[0].content[{j + 1}].image_url"
                                                       for j in range(len(images))]
    if dialect == "responses":
        parts = [{"type": "input_image", "image_url": f"data:image/jpeg;base64,{i}"} for i in images]
        return "/v1/responses", {"model": "test-model", "input": [{"role": "user", "content": parts}]}, [
            f"input[0].content[{j}].image_url" for j in range(len(images))]
    if dialect == "anthropic":
        blocks = [{"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": i}}
                  for i in images]
        return "/v1/messages", {"model": "test-model", "max_tokens": 4, "messages": [
            {"role": "user", "content": blocks or "x"}]}, [f"messages[0].content[{j}].source"
                                                           for j in range(len(images))]
    return "/api/chat", {"model": "test-model", "stream": False, "messages": [
        {"role": "user", "content": "x", "images": images}]}, [f"messages[0].images[{j}]" for j in range(len(images))]


def _error_text(body: Any) -> str:
    error = body.get("error")
    return error if isinstance(error, str) else f"{error.get('param')} {error.get('message')}"


@SAFE
@given(dialect=st.sampled_from(["openai", "responses", "anthropic", "ollama"]),
       # a few, or more than MAX_IMAGES_PER_REQUEST (16)
       images=st.lists(encoded, min_size=1, max_size=3) | st.lists(encoded, min_size=17, max_size=17))
async def test_hostile_images_get_a_4xx_naming_the_field_never_a_5xx(engine, client, dialect, images):
    path, body, fields = _body(dialect, images)
    with anyio.fail_after(10):
        r = await client.post(path, json=body)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert 400 <= r.status_code < 500
        said = _error_text(r.json())
        assert any(f in said for f in fields), said
