"""Every dialect's image shape reaches the engine as the canonical part, in its place among the message's parts,
and each bad image is a 4xx naming its field in the dialect's own error shape (the engine's fake peer records
the Generate the API sent)."""

from __future__ import annotations

import hashlib

import msgspec
import pytest

import ipc
from ipc.messages import ModelFacts
from tests.images import GIF, JPEG, PNG, b64, data_url, png_bomb

pytestmark = pytest.mark.anyio

OPENAI = {"model": "test-model"}
ANTHROPIC = {"model": "test-model", "max_tokens": 8}


def part(data: bytes, media_type: str, width: int, height: int) -> dict:
    return {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": media_type,
            "width": width, "height": height, "data": data}


def text(t: str) -> dict:
    return {"type": "text", "text": t}


P, J, G = part(PNG, "image/png", 3, 2), part(JPEG, "image/jpeg", 5, 4), part(GIF, "image/gif", 2, 9)


def image_url(data: bytes, **extra: str) -> dict:
    return {"type": "image_url", "image_url": {"url": data_url(data), **extra}}


async def sent(engine, client, path: str, body: dict) -> list[dict]:
    r = await client.post(path, json={**body, "stream": False})
    assert r.status_code == 200, r.text
    return engine.generates[-1].messages


# ---------------------------------------------------------------- each shape -> the canonical part, in order


async def test_openai_chat_image_url_parts_keep_their_place(engine, client):
    content = [text("a"), image_url(PNG, detail="high"), text("b"), image_url(JPEG)]
    messages = await sent(engine, client, "/v1/chat/completions", {**OPENAI, "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": content}]})
    assert messages == [{"role": "system", "content": "be brief"},
                        {"role": "user", "content": [text("a"), P, text("b"), J]}]


async def test_a_text_only_chat_reaches_the_engine_as_before(engine, client):
    messages = await sent(engine, client, "/v1/chat/completions", {**OPENAI, "messages": [
        {"role": "user", "content": [text("a"), text("b")]}]})
    assert messages == [{"role": "user", "content": "a\nb"}]


async def test_responses_input_image_in_a_message_and_in_a_tool_output(engine, client):
    messages = await sent(engine, client, "/v1/responses", {**OPENAI, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "what is it?"},
                                     {"type": "input_image", "image_url": data_url(GIF), "detail": "auto"}]},
        {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [
            {"type": "input_image", "image_url": data_url(PNG)}, {"type": "input_text", "text": "done"}]}]})
    assert messages[0] == {"role": "user", "content": [text("what is it?"), G]}
    assert messages[2] == {"role": "tool", "content": [P, text("done")], "tool_call_id": "c1"}


async def test_anthropic_image_blocks_in_a_message_and_in_a_tool_result(engine, client):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg", "data": b64(JPEG)}}
    messages = await sent(engine, client, "/v1/messages", {**ANTHROPIC, "messages": [
        {"role": "user", "content": [image, {"type": "text", "text": "and this?"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "shot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "text", "text": "here"}, {**image, "source": {**image["source"], "data": b64(PNG)}}]}]}]})
    assert messages[0] == {"role": "user", "content": [J, text("and this?")]}
    assert messages[2] == {"role": "tool", "tool_call_id": "t1", "content": [text("here"), P]}


async def test_ollama_images_follow_the_text_in_order(engine, client):
    messages = await sent(engine, client, "/api/chat", {**OPENAI, "messages": [
        {"role": "user", "content": "compare", "images": [b64(PNG), b64(GIF)]}]})
    assert messages == [{"role": "user", "content": [text("compare"), P, G]}]
    messages = await sent(engine, client, "/api/generate", {**OPENAI, "prompt": "what?", "images": [b64(JPEG)]})
    assert messages == [{"role": "user", "content": [text("what?"), J]}]


async def test_tokenize_and_count_tokens_carry_images_too(engine, client):
    r = await client.post("/tokenize", json={**OPENAI, "messages": [{"role": "user", "content": [image_url(PNG)]}]})
    assert r.status_code == 200, r.text
    assert engine.token_requests[-1].messages == [{"role": "user", "content": [P]}]
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    r = await client.post("/v1/messages/count_tokens", json={"model": "test-model", "messages": [
        {"role": "user", "content": [image]}]})
    assert r.status_code == 200, r.text
    assert engine.token_requests[-1].messages == [{"role": "user", "content": [P]}]


# ---------------------------------------------------------------- bad images: 400 naming the field


async def test_openai_errors_name_the_part(engine, client):
    bad = {"type": "image_url", "image_url": {"url": data_url(b"GIF89a\x01")}}
    r = await client.post("/v1/chat/completions", json={**OPENAI, "messages": [
        {"role": "user", "content": [text("x")]}, {"role": "user", "content": [text("y"), bad]}]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages[1].content[1].image_url"
    assert "truncated" in error["message"]
    r = await client.post("/v1/chat/completions", json={**OPENAI, "messages": [
        {"role": "assistant", "content": [image_url(PNG)]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0]"
    r = await client.post("/v1/chat/completions", json={**OPENAI, "messages": [
        {"role": "user", "content": [image_url(PNG, detail="extreme")]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].image_url.detail"
    assert not engine.generates


async def test_responses_file_id_is_refused_saying_what_is_taken(engine, client):
    r = await client.post("/v1/responses", json={**OPENAI, "input": [{"role": "user", "content": [
        {"type": "input_text", "text": "x"}, {"type": "input_image", "file_id": "file-abc", "detail": "auto"}]}]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "input[0].content[1].file_id"
    assert "data URL" in error["message"] and "http(s) URL" in error["message"]


async def test_anthropic_errors_name_the_block(engine, client):
    async def message(blocks: list, role: str = "user") -> str:
        r = await client.post("/v1/messages", json={**ANTHROPIC, "messages": [{"role": role, "content": blocks}]})
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        return r.json()["error"]["message"]

    garbage = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "%%%"}}
    assert "'messages[0].content[1].source'" in await message([{"type": "text", "text": "x"}, garbage])
    stored = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    assert "'messages[0].content[0].source.type'" in await message([stored])
    url = {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}}
    assert "IMAGE_URL_FETCH=off" in await message([url])
    assert "'messages[0].content[0].type'" in await message([url], role="assistant")
    assert not engine.generates


async def test_ollama_errors_name_the_image(engine, client):
    r = await client.post("/api/chat", json={**OPENAI, "stream": False, "messages": [
        {"role": "user", "content": "x", "images": [b64(PNG), b64(png_bomb(40_000, 40_000))]}]})
    assert r.status_code == 400 and "'messages[0].images[1]'" in r.json()["error"]
    assert "MAX_IMAGE_PIXELS" in r.json()["error"]
    r = await client.post("/api/generate", json={**OPENAI, "stream": False, "prompt": "x", "images": ["!!"]})
    assert r.status_code == 400 and "'images[0]'" in r.json()["error"]
    assert not engine.generates


async def test_too_many_images_are_refused_before_any_is_decoded(engine, make_client):
    content = [image_url(PNG), image_url(PNG), {"type": "image_url", "image_url": {"url": "data:,garbage"}}]
    async with make_client(MAX_IMAGES_PER_REQUEST=2) as client:
        r = await client.post("/v1/chat/completions", json={**OPENAI, "messages": [
            {"role": "user", "content": content}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[2].image_url"
    assert "MAX_IMAGES_PER_REQUEST" in r.json()["error"]["message"]


# ---------------------------------------------------------------- the model says whether it takes images


async def test_models_and_show_say_vision_only_for_a_model_that_takes_images(engine, client):
    for vision in (False, True):
        engine.info = msgspec.structs.replace(engine.info, facts=ModelFacts(vision=vision))
        model = (await client.get("/v1/models")).json()["data"][0]
        assert model["input_modalities"] == (["text", "image"] if vision else ["text"])
        show = (await client.post("/api/show", json={"model": "test-model"})).json()
        assert ("vision" in show["capabilities"]) is vision


async def test_the_engines_refusal_reaches_each_dialect_naming_the_field_the_client_sent(engine, client):
    message = "model test-model does not take images; serve a vision-language model (docs/vision.md) or send text only"
    engine.refuse(ipc.Error(status=400, message=message, param="messages[0].content[0]"))
    r = await client.post("/v1/chat/completions", json={**OPENAI, "messages": [
        {"role": "user", "content": [image_url(PNG)]}]})
    assert r.status_code == 400 and r.json()["error"] == {"message": message, "type": "invalid_request_error",
                                                          "param": "messages[0].content[0].image_url", "code": None}
    # the instructions are the engine's first message: its messages[1] is the client's input[0]
    engine.refuse(ipc.Error(status=400, message=message, param="messages[1].content[1]"))
    r = await client.post("/v1/responses", json={**OPENAI, "instructions": "be brief", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "x"},
                                     {"type": "input_image", "image_url": data_url(PNG)}]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].content[1].image_url"
    r = await client.post("/api/chat", json={**OPENAI, "stream": False, "messages": [
        {"role": "user", "content": "", "images": [b64(PNG)]}]})
    assert r.status_code == 400 and "does not take images" in r.json()["error"]
