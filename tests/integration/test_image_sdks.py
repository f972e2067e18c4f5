"""Each official SDK's image request reaches the real engine, which refuses it for the demo model (no vision)
with the one error of docs/vision.md: proof the image was carried, not dropped, in every dialect."""

from __future__ import annotations

import anthropic
import ollama
import openai
import pytest

from tests.images import PNG, b64, data_url, screenshot_png

REFUSAL = "does not take images; serve a vision-language model (docs/vision.md) or send text only"


@pytest.fixture(scope="module")
def claude(stack):
    with anthropic.Anthropic(base_url=stack.base_url, api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture(scope="module")
def llama(stack):
    with ollama.Client(host=stack.base_url, timeout=60) as c:
        yield c


def test_openai_chat_image_url(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": data_url(PNG), "detail": "low"}}]}])
    assert info.value.status_code == 400 and REFUSAL in info.value.body["message"]
    assert info.value.body["param"] == "messages[0].content[1].image_url"


def test_openai_responses_input_image(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="default", max_output_tokens=4, instructions="be brief", input=[
            {"role": "user", "content": [{"type": "input_text", "text": "what is this?"},
                                         {"type": "input_image", "image_url": data_url(PNG), "detail": "auto"}]}])
    assert info.value.status_code == 400 and REFUSAL in info.value.body["message"]
    assert info.value.body["param"] == "input[0].content[1].image_url"


def test_anthropic_image_block(claude):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="default", max_tokens=4, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}},
            {"type": "text", "text": "what is this?"}]}])
    assert info.value.status_code == 400 and info.value.body["error"]["type"] == "invalid_request_error"
    assert REFUSAL in info.value.body["error"]["message"]


def test_a_4k_screenshot_in_an_agent_turn_passes_the_default_size_limits(claude):
    """A 4K PNG screenshot (about 7 MB, 9.3 MB as base64) after a long conversation, as an agent sends it: the
    default MAX_REQUEST_BYTES, MAX_IMAGE_BYTES and MAX_FRAME_BYTES let it reach the engine (here the demo model's
    refusal), where a 413 or a 400 on its size would have stopped it."""
    shot = screenshot_png()
    history = [{"role": "user", "content": "read the file " * 2000}, {"role": "assistant", "content": "done " * 2000}]
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model="default", max_tokens=4, messages=history + [{"role": "user", "content": [
            {"type": "text", "text": "what does the screen show?"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(shot)}}]}])
    assert REFUSAL in info.value.body["error"]["message"]


def test_ollama_chat_images(llama):
    # the client takes the file's bytes and sends them base64-encoded, as Ollama's own server expects
    with pytest.raises(ollama.ResponseError) as info:
        llama.chat(model="default", messages=[{"role": "user", "content": "what is this?", "images": [PNG]}])
    assert info.value.status_code == 400 and REFUSAL in info.value.error
