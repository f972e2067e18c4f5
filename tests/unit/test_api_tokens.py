"""POST /tokenize and /detokenize against a fake engine on the real wire: vLLM's shapes in and out, the
chat rendered from the same engine messages a chat completion sends, and every bad input a 4xx by name."""

from __future__ import annotations

import msgspec
import pytest

import ipc
from api.openai.protocol import ChatCompletionRequest
from api.openai.serving import chat_generate
from api.openai.tokens import TokenizeChatRequest, tokenize_message
from config import load_settings
from tests.unit.openai_errors import assert_error

pytestmark = pytest.mark.anyio

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
# every kind of message the chat endpoint takes: developer (read as system), text parts, a tool call whose
# arguments are JSON text, its result
CONVERSATION = [
    {"role": "developer", "content": "Be brief."},
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


async def test_a_prompt_is_tokenized_in_vllms_shape(engine, client):
    r = await client.post("/tokenize", json={"model": "test-model", "prompt": "héllo"})
    assert r.status_code == 200, r.text
    assert r.json() == {"count": 5, "max_model_len": 4096, "tokens": [ord(c) for c in "héllo"], "token_strs": None}
    assert engine.token_requests == [ipc.Tokenize(kind="completion", prompt="héllo", add_special_tokens=True)]


async def test_token_strs_and_special_tokens_on_request(engine, client):
    r = await client.post("/tokenize", json={"prompt": "ab", "add_special_tokens": False, "return_token_strs": True})
    assert r.status_code == 200, r.text
    assert r.json()["token_strs"] == ["a", "b"]
    assert engine.token_requests[0].add_special_tokens is False and engine.token_requests[0].return_token_strs


async def test_an_empty_prompt_has_no_tokens(engine, client):
    r = await client.post("/tokenize", json={"prompt": ""})
    assert r.status_code == 200, r.text
    assert r.json()["count"] == 0 and r.json()["tokens"] == []


async def test_a_chat_reaches_the_engine_as_the_chat_endpoints_messages_and_tools(engine, client):
    r = await client.post("/tokenize", json={"model": "default", "messages": CONVERSATION, "tools": [WEATHER]})
    assert r.status_code == 200, r.text
    (sent,) = engine.token_requests
    chat = chat_generate(msgspec.convert({"model": "test-model", "messages": CONVERSATION, "tools": [WEATHER]},
                                         ChatCompletionRequest), "chatcmpl-1", load_settings({"MODEL": "test-model"},
                                                                                             "/nonexistent/.env"))
    assert (sent.kind, sent.messages, sent.tools) == ("chat", chat.messages, chat.tools)
    assert sent.messages[0]["role"] == "system" and sent.messages[1]["content"] == "Weather\nin Paris?"
    # vLLM's chat defaults: the assistant's turn is opened, the template alone adds special tokens
    assert (sent.add_generation_prompt, sent.continue_final_message, sent.add_special_tokens) == (True, False, False)
    assert sent.enable_thinking is None and sent.return_token_strs is False


@pytest.mark.parametrize("kwargs", [{"enable_thinking": False}, {"enable_thinking": True}, {"enable_thinking": None},
                                    {}, None])
def test_chat_template_kwargs_switch_thinking_only(kwargs):
    req = msgspec.convert({"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": kwargs},
                          TokenizeChatRequest)
    msg = tokenize_message(req, load_settings({"MODEL": "test-model"}, "/nonexistent/.env"))
    assert msg.enable_thinking == (kwargs or {}).get("enable_thinking")


async def test_continuing_the_last_message(engine, client):
    r = await client.post("/tokenize", json={
        "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}],
        "add_generation_prompt": False, "continue_final_message": True, "add_special_tokens": True})
    assert r.status_code == 200, r.text
    sent = engine.token_requests[0]
    assert (sent.add_generation_prompt, sent.continue_final_message, sent.add_special_tokens) == (False, True, True)


CHAT = {"messages": [{"role": "user", "content": "hi"}]}
DEEP: dict = {}
for _ in range(70):
    DEEP = {"type": "object", "properties": {"a": DEEP}}


@pytest.mark.parametrize(("body", "param", "code"), [
    ({}, "prompt", None),
    ({"prompt": 5}, "prompt", None),
    ({"prompt": [1, 2]}, "prompt", None),
    ({"prompt": "x", **CHAT}, "prompt", None),
    ({"prompt": "x", "add_special_tokens": "yes"}, "add_special_tokens", None),
    ({"prompt": "x", "return_token_strs": 1}, "return_token_strs", None),
    ({"messages": []}, "messages", None),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", None),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages[0].content[0].image_url.url", None),
    ({**CHAT, "continue_final_message": True}, "continue_final_message", None),
    ({**CHAT, "chat_template": "{{ messages }}"}, "chat_template", "unsupported_parameter"),
    ({**CHAT, "mm_processor_kwargs": {"a": 1}}, "mm_processor_kwargs", "unsupported_parameter"),
    ({**CHAT, "chat_template_kwargs": {"reasoning_effort": "high"}}, "chat_template_kwargs.reasoning_effort",
     "unsupported_parameter"),
    ({**CHAT, "chat_template_kwargs": {"enable_thinking": "no"}}, "chat_template_kwargs.enable_thinking", None),
    ({**CHAT, "chat_template_kwargs": []}, "chat_template_kwargs", None),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": ""}}]}, "tools[0].function.name", None),
    ({**CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": DEEP}}]},
     "tools[0].function.parameters", None),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]}, "messages", None),
])
async def test_bad_tokenize_bodies_are_400_naming_the_param(engine, client, body, param, code):
    r = await client.post("/tokenize", json=body)
    assert_error(r, 400, param=param, code=code, type_="invalid_request_error")
    assert engine.token_requests == []


async def test_too_many_messages_is_400(engine, make_client):
    async with make_client(MAX_MESSAGES=2) as client:
        r = await client.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}] * 3})
    assert_error(r, 400, param="messages")
    assert engine.token_requests == []


async def test_a_body_beyond_max_request_bytes_is_413(engine, make_client):
    async with make_client(MAX_REQUEST_BYTES=1024) as client:
        r = await client.post("/tokenize", json={"prompt": "x" * 2000})
        assert_error(r, 413, code="request_too_large")
        r = await client.post("/detokenize", json={"tokens": [1] * 600})
        assert_error(r, 413, code="request_too_large")
    assert engine.token_requests == []


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_a_body_that_is_not_declared_json_is_415(engine, client, path):
    r = await client.post(path, content=b'{"prompt": "x"}', headers={"Content-Type": "text/plain"})
    assert_error(r, 415, code="unsupported_media_type")


@pytest.mark.parametrize("body", [b"[1, 2]", b"{", b'"prompt"'])
async def test_a_body_that_is_not_an_object_is_400(engine, client, body):
    r = await client.post("/tokenize", content=body, headers={"Content-Type": "application/json"})
    assert_error(r, 400)


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_another_model_is_404(engine, client, path):
    body = {"model": "gpt-4", **({"prompt": "x"} if path == "/tokenize" else {"tokens": [1]})}
    assert_error(await client.post(path, json=body), 404, param="model", code="model_not_found")


async def test_detokenize_answers_the_prompt(engine, client):
    r = await client.post("/detokenize", json={"model": "test-model", "tokens": [104, 105]})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": "hi"}
    assert engine.token_requests == [ipc.Detokenize(tokens=[104, 105])]


@pytest.mark.parametrize(("body", "param"), [
    ({}, "tokens"),
    ({"tokens": "hi"}, "tokens"),
    ({"tokens": [1, -1]}, "tokens[1]"),
    ({"tokens": [2**31]}, "tokens[0]"),
    ({"tokens": [2**64]}, "tokens[0]"),
    ({"tokens": [1.5]}, "tokens[0]"),
])
async def test_bad_detokenize_bodies_are_400_naming_the_param(engine, client, body, param):
    assert_error(await client.post("/detokenize", json=body), 400, param=param)
    assert engine.token_requests == []


async def test_the_engines_refusal_reaches_the_client(engine, client):
    engine.token_answer = lambda msg: ipc.Error(status=400, param="tokens[0]",
                                                message="tokens[0] is 5000, outside the vocabulary (0..1023)")
    error = assert_error(await client.post("/detokenize", json={"tokens": [5000]}), 400, param="tokens[0]")
    assert "outside the vocabulary" in error["message"]


async def test_an_unexpected_answer_is_a_5xx_not_a_crash(engine, client):
    engine.token_answer = lambda msg: ipc.Detokenized(prompt="wrong kind")
    r = await client.post("/tokenize", json={"prompt": "x"})
    assert r.status_code == 503 and r.json()["error"]["code"] == "engine_unavailable"


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_no_engine_is_503(client, path):
    r = await client.post(path, json={"prompt": "x"} if path == "/tokenize" else {"tokens": [1]})
    assert_error(r, 503, code="engine_unavailable", type_="server_error")
    assert r.headers["retry-after"]


@pytest.mark.parametrize("path", ["/tokenize", "/detokenize"])
async def test_the_api_key_guards_them(engine, make_client, path):
    body = {"prompt": "x"} if path == "/tokenize" else {"tokens": [1]}
    async with make_client(API_KEY="sekret") as client:
        assert_error(await client.post(path, json=body), 401, code="invalid_api_key")
        r = await client.post(path, json=body, headers={"Authorization": "Bearer sekret"})
        assert r.status_code == 200, r.text
