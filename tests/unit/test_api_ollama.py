"""Ollama's /api against a fake engine speaking the real wire protocol: translation, bodies, NDJSON, errors."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

import ipc
from ipc.messages import ModelFacts, RankState, TokenLogprob, ToolCall, TopLogprob
from api.errors import ContextLengthExceeded, EngineUnavailable, Overloaded
from api.ollama.models import human_number
from tests.unit.named_events import play

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "stream": False, "messages": [{"role": "user", "content": "Hi"}]}
GENERATE = {"model": "test-model", "stream": False, "prompt": "Hi"}
WEATHER = {"type": "function", "function": {"name": "weather", "description": "The weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
FACTS = ModelFacts(architecture="qwen3", parameters=7_615_616_512, weight_bytes=4_300_000_000, quantization_bits=4,
                   quantization_mode="affine", dtype="bfloat16",
                   config={"hidden_size": 3584, "num_hidden_layers": 28, "vocab_size": 152064},
                   chat_template="{{ messages }}", thinking=True, tool_calling=True)
TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z")
DURATIONS = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")


def lines_of(r) -> list[dict]:
    assert r.headers["content-type"] == "application/x-ndjson", r.text
    return [json.loads(line) for line in r.text.splitlines()]


def assert_error(r, status: int, *words: str) -> str:
    """r is Ollama's {"error": message} with this status; the message holds every word."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert list(body) == ["error"]
    for word in words:
        assert word in body["error"], body
    return body["error"]


def assert_done(body: dict, prompt: int, completion: int, reason: str = "stop") -> None:
    assert body["done"] is True and body["done_reason"] == reason
    assert body["prompt_eval_count"] == prompt and body["eval_count"] == completion
    assert all(isinstance(body[k], int) and body[k] >= 0 for k in DURATIONS)
    assert body["total_duration"] >= body["load_duration"] + body["prompt_eval_duration"] + body["eval_duration"] - 3


# ---------------------------------------------------------------- chat


async def test_chat_body(engine, client):
    r = await client.post("/api/chat", json=CHAT)
    assert r.status_code == 200, r.text
    body = r.json()
    assert TIMESTAMP.fullmatch(body.pop("created_at"))
    assert_done(body, 7, 2)
    assert {k: body[k] for k in ("model", "message")} == {
        "model": "test-model", "message": {"role": "assistant", "content": "Hello world"}}
    gen = engine.generates[0]
    assert gen.kind == "chat" and gen.messages == [{"role": "user", "content": "Hi"}]
    assert gen.params.max_tokens == 32768 and gen.params.temperature == 1.0  # the /v1 defaults


async def test_the_body_names_the_model_as_asked(engine, client):
    for name in ("default", "test-model:latest", "default:latest"):
        r = await client.post("/api/chat", json={**CHAT, "model": name})
        assert r.status_code == 200 and r.json()["model"] == name


async def test_chat_translation(engine, client):
    body = {
        "model": "test-model", "stream": False, "tools": [WEATHER], "think": "high", "keep_alive": "5m",
        "format": {"type": "object", "properties": {"a": {"type": "integer"}}},
        "options": {"num_predict": 9, "temperature": 0, "top_k": -1, "top_p": 0.5, "min_p": 0.1, "seed": 3,
                    "stop": "END", "repeat_penalty": 1.1, "presence_penalty": 0.5, "frequency_penalty": -0.5,
                    "num_ctx": 999999, "num_gpu": 1, "use_mmap": True, "repeat_last_n": 64, "mirostat": 0,
                    "typical_p": 1.0, "some_new_option": [1]},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": "", "thinking": "hm", "tool_calls": [
                {"function": {"name": "weather", "arguments": {"city": "Oslo"}}},
                {"id": "call_x", "function": {"index": 1, "name": "clock", "arguments": '{"tz": "UTC"}'}}]},
            {"role": "tool", "content": "12:00", "tool_name": "clock"},
            {"role": "tool", "content": "cold", "tool_name": "weather"},
            {"role": "tool", "content": "late", "tool_call_id": "call_late"},
        ],
    }
    assert (await client.post("/api/chat", json=body)).status_code == 200
    gen = engine.generates[0]
    assert gen.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2_0", "type": "function", "function": {"name": "weather", "arguments": {"city": "Oslo"}}},
            {"id": "call_x", "type": "function", "function": {"name": "clock", "arguments": {"tz": "UTC"}}}]},
        {"role": "tool", "content": "12:00", "tool_call_id": "call_x"},
        {"role": "tool", "content": "cold", "tool_call_id": "call_2_0"},
        {"role": "tool", "content": "late", "tool_call_id": "call_late"},
    ]
    assert gen.tools == [WEATHER] and gen.tool_choice is None
    # as Ollama reads a schema: an object that declares properties takes no others unless it says so
    assert gen.json_schema == {**body["format"], "additionalProperties": False} and gen.enable_thinking is True
    assert gen.params == ipc.SamplingParams(
        max_tokens=9, temperature=0.0, top_p=0.5, top_k=0, min_p=0.1, seed=3, stop=["END"], repetition_penalty=1.1,
        presence_penalty=0.5, frequency_penalty=-0.5)


async def test_unknown_options_are_logged_at_debug(engine, client, caplog):
    caplog.set_level("DEBUG", logger="api.ollama.routes")
    body = {**CHAT, "options": {"temperature": 0, "num_ctx": 8192, "some_new_option": 1}}
    assert (await client.post("/api/chat", json=body)).status_code == 200
    assert "ignoring unknown options: some_new_option" in caplog.text


@pytest.mark.parametrize(("fmt", "schema"), [("json", {"type": "object"}), ("", None)])
async def test_format_json_is_any_object(engine, client, fmt, schema):
    assert (await client.post("/api/chat", json={**CHAT, "format": fmt})).status_code == 200
    assert engine.generates[0].json_schema == schema


@pytest.mark.parametrize(("think", "enabled", "level"), [(True, True, ""), (False, False, ""), ("low", True, "low"),
                                                         ("max", True, "max"), (None, None, "")])
async def test_think_switches_the_template_and_a_level_reaches_it(engine, client, think, enabled, level):
    assert (await client.post("/api/chat", json={**CHAT, "think": think})).status_code == 200
    assert engine.generates[0].enable_thinking is enabled and engine.generates[0].reasoning_effort == level


@pytest.mark.parametrize(("num_predict", "max_tokens"), [(-1, 32768), (-2, 32768), (None, 32768), (1, 1)])
async def test_num_predict(engine, client, num_predict, max_tokens):
    r = await client.post("/api/chat", json={**CHAT, "options": {"num_predict": num_predict, "seed": -1}})
    assert r.status_code == 200
    assert engine.generates[0].params.max_tokens == max_tokens and engine.generates[0].params.seed is None
    # no limit from the client: the engine fits the server's ceiling to the context and the KV budget
    assert engine.generates[0].params.max_tokens_default is (num_predict != 1)


async def test_a_message_without_content_and_a_null_option(engine, client):
    body = {**CHAT, "options": {"temperature": None}, "messages": [
        {"role": "user"}, {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f"}}]}]}
    assert (await client.post("/api/chat", json=body)).status_code == 200
    assert engine.generates[0].messages == [
        {"role": "user", "content": ""},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1_0", "type": "function", "function": {"name": "f", "arguments": {}}}]}]
    assert engine.generates[0].params.temperature == 1.0


async def test_tool_calls_and_thinking_in_the_body(engine, client):
    call = ToolCall(id="call_abc", name="weather", arguments='{"city": "Paris"}')
    play(engine, ipc.Delta(request_id="", text="", reasoning="Think", completion_tokens=1),
         ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=5, text="\n",
                    tool_calls=[call]))
    body = (await client.post("/api/chat", json={**CHAT, "tools": [WEATHER]})).json()
    assert body["message"] == {"role": "assistant", "content": "", "thinking": "Think", "tool_calls": [
        {"id": "call_abc", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}}]}
    assert_done(body, 7, 5)


async def test_length_is_the_done_reason(engine, client):
    engine.reply_with(["a"], finish_reason="length")
    assert (await client.post("/api/chat", json=CHAT)).json()["done_reason"] == "length"


async def test_logprobs(engine, client):
    lp = TokenLogprob(token="Hi", logprob=-0.5, bytes=[72, 105], top=[TopLogprob(token="Hi", logprob=-0.5,
                                                                                bytes=[72, 105])])
    play(engine, ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=1, text="Hi",
                            logprobs=[lp]))
    body = (await client.post("/api/chat", json={**CHAT, "logprobs": True, "top_logprobs": 1})).json()
    assert engine.generates[0].params.logprobs and engine.generates[0].params.top_logprobs == 1
    assert body["logprobs"] == [{"token": "Hi", "logprob": -0.5, "bytes": [72, 105], "top_logprobs": [
        {"token": "Hi", "logprob": -0.5, "bytes": [72, 105]}]}]


async def test_top_logprobs_alone_asks_for_nothing(engine, client):
    body = (await client.post("/api/chat", json={**CHAT, "top_logprobs": 3})).json()
    assert "logprobs" not in body and not engine.generates[0].params.logprobs


# ---------------------------------------------------------------- streams


async def test_a_stream_is_ndjson_ending_in_done(engine, client):
    r = await client.post("/api/chat", json={**CHAT, "stream": None})
    assert r.status_code == 200
    lines = lines_of(r)
    assert [line["message"] for line in lines] == [
        {"role": "assistant", "content": "Hello"}, {"role": "assistant", "content": " world"},
        {"role": "assistant", "content": ""}]
    assert [line["done"] for line in lines] == [False, False, True]
    assert "done_reason" not in lines[0] and "eval_count" not in lines[0]
    assert_done(lines[-1], 7, 2)


async def test_a_streamed_tool_call_and_thinking(engine, client):
    call = ToolCall(id="call_abc", name="weather", arguments='{"city": "Paris"}')
    play(engine, ipc.Delta(request_id="", text="", reasoning="Think", completion_tokens=1),
         ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=5, tool_calls=[call]))
    lines = lines_of(await client.post("/api/chat", json={**CHAT, "stream": True}))
    assert [line["message"] for line in lines] == [
        {"role": "assistant", "content": "", "thinking": "Think"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_abc", "function": {"index": 0, "name": "weather", "arguments": {"city": "Paris"}}}]},
        {"role": "assistant", "content": ""}]


async def test_an_error_after_the_headers_is_a_last_error_line(engine, client):
    engine.die_after(["Hel"])
    lines = lines_of(await client.post("/api/chat", json={**CHAT, "stream": True}))
    assert lines[0]["message"]["content"] == "Hel"
    assert list(lines[-1]) == ["error"] and "engine" in lines[-1]["error"]


# ---------------------------------------------------------------- generate


async def test_generate_body_and_translation(engine, client):
    r = await client.post("/api/generate", json={**GENERATE, "system": "Be brief.", "think": False})
    body = r.json()
    assert body["response"] == "Hello world" and "message" not in body
    assert_done(body, 7, 2)
    gen = engine.generates[0]
    assert gen.kind == "chat" and gen.enable_thinking is False
    assert gen.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


async def test_raw_generate_is_a_completion_of_the_prompt(engine, client):
    r = await client.post("/api/generate", json={**GENERATE, "raw": True, "format": "json", "context": []})
    assert r.status_code == 200
    gen = engine.generates[0]
    assert gen.kind == "completion" and gen.prompt == "Hi" and gen.json_schema == {"type": "object"}


async def test_generate_stream(engine, client):
    lines = lines_of(await client.post("/api/generate", json={**GENERATE, "stream": True}))
    assert [line["response"] for line in lines] == ["Hello", " world", ""]
    assert_done(lines[-1], 7, 2)


@pytest.mark.parametrize(("extra", "words"), [
    ({"suffix": "end"}, ["'suffix'", "not supported"]),
    ({"template": "{{ .Prompt }}"}, ["'template'", "raw"]),
    ({"context": [1, 2]}, ["'context'", "/api/chat"]),
    ({"images": ["AAAA"]}, ["'images'", "text only"]),
    ({"raw": True, "system": "x"}, ["'system'", "raw"]),
])
async def test_generate_refusals(engine, client, extra, words):
    assert_error(await client.post("/api/generate", json={**GENERATE, **extra}), 400, *words)
    assert not engine.generates


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate"])
async def test_a_load_call_answers_done_without_the_engine(engine, client, path):
    body = {"model": "test-model", "keep_alive": 0} if path == "/api/generate" else {"model": "test-model",
                                                                                      "messages": []}
    r = await client.post(path, json=body)
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    out = r.json()
    assert out["done"] is True and out["done_reason"] == "load" and "eval_count" not in out
    assert out.get("response", out.get("message", {}).get("content")) == ""
    assert not engine.generates
    assert_error(await client.post(path, json={**body, "model": "llama3"}), 404, "model 'llama3' not found")


# ---------------------------------------------------------------- refusals and errors


@pytest.mark.parametrize(("body", "words"), [
    ({**CHAT, "model": "llama3.2"}, ["model 'llama3.2' not found", "test-model"]),
])
async def test_unknown_model_is_a_404(engine, client, body, words):
    assert_error(await client.post("/api/chat", json=body), 404, *words)


@pytest.mark.parametrize(("body", "words"), [
    ({**CHAT, "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]}, ["'messages[0].images'"]),
    ({**CHAT, "options": {"mirostat": 2}}, ["'options.mirostat'", "not available"]),
    ({**CHAT, "options": {"typical_p": 0.7}}, ["'options.typical_p'"]),
    ({**CHAT, "options": {"tfs_z": 0.9}}, ["'options.tfs_z'"]),
    ({**CHAT, "options": {"num_predict": 0}}, ["'options.num_predict'", "-1"]),
    ({**CHAT, "options": {"num_predict": 40000}}, ["'options.num_predict'", "32768"]),
    ({**CHAT, "options": {"temperature": "hot"}}, ["'options.temperature'"]),
    ({**CHAT, "think": "extreme"}, ["'think'"]),
    ({**CHAT, "format": "yaml"}, ["'format'"]),
    ({**CHAT, "messages": [{"role": "developer", "content": "x"}]}, ["'messages[0].role'"]),
    ({**CHAT, "messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "[1]"}}]}]},
     ["'messages[0].tool_calls[0].function.arguments'", "JSON object"]),
    ({"messages": []}, ["Missing required parameter: 'model'"]),
])
async def test_bad_requests_are_400s_naming_the_parameter(engine, client, body, words):
    assert_error(await client.post("/api/chat", json=body), 400, *words)
    assert not engine.generates


async def test_a_body_without_a_json_content_type_is_read_as_json_like_ollama_does(engine, client):
    # `curl -d` (Ollama's documented examples) sends application/x-www-form-urlencoded
    r = await client.post("/api/chat", content=json.dumps({**CHAT, "stream": False}),
                          headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200, r.text
    assert engine.generates


async def test_a_web_page_of_another_origin_cannot_post_a_non_json_body(engine, client):
    r = await client.post("/api/chat", content=json.dumps(CHAT),
                          headers={"content-type": "text/plain", "origin": "https://evil.example"})
    assert_error(r, 415, "Content-Type: application/json")
    assert not engine.generates


@pytest.mark.parametrize(("error", "status"), [
    (ipc.Error(status=400, code=ContextLengthExceeded.code, message="prompt too long", param="messages"), 400),
    (ipc.Error(status=429, code="queue_full", message="the queue is full"), 429),
    (ipc.Error(status=503, code=EngineUnavailable.code, message="draining"), 503),
])
@pytest.mark.parametrize("stream", [True, False])
async def test_engine_errors_keep_their_status(engine, client, error, status, stream):
    engine.refuse(error)
    r = await client.post("/api/chat", json={**CHAT, "stream": stream})
    assert_error(r, status, error.message)
    if status == 429:
        assert r.headers["retry-after"] == str(Overloaded.retry_after)


@pytest.mark.parametrize(("method", "path", "words"), [
    ("POST", "/api/pull", ["pulling models is not supported", "test-model", "loaded at start"]),
    ("POST", "/api/push", ["pushing models"]),
    ("POST", "/api/create", ["creating models"]),
    ("POST", "/api/copy", ["copying models"]),
    ("DELETE", "/api/delete", ["deleting models"]),
    ("POST", "/api/blobs/sha256:abc", ["uploading blobs"]),
    ("HEAD", "/api/blobs/sha256:abc", []),
])
async def test_model_management_is_501(engine, client, method, path, words):
    r = await client.request(method, path, json={"model": "test-model"})
    if method == "HEAD":
        assert r.status_code == 501
    else:
        assert_error(r, 501, *words)


async def test_an_unknown_route_is_a_404_in_ollama_shape(client):
    assert_error(await client.get("/api/nothing"), 404, "/api/nothing")
    assert_error(await client.get("/api/chat"), 405, "GET")


async def test_the_api_key_guards_api_but_not_the_root(engine, make_client):
    async with make_client(API_KEY="sekrit") as c:
        assert_error(await c.get("/api/tags"), 401, "Authorization: Bearer")
        assert (await c.get("/api/tags", headers={"authorization": "Bearer sekrit"})).status_code == 200
        assert (await c.get("/")).text == "Ollama is running"


# ---------------------------------------------------------------- models and version


async def test_root_and_version(client):
    r = await client.get("/")
    assert r.status_code == 200 and r.text == "Ollama is running"
    assert (await client.head("/")).status_code == 200
    version = (await client.get("/api/version")).json()["version"]
    assert tuple(int(p) for p in version.split(".")) >= (0, 6, 4)


async def test_tags_show_ps_with_the_engine_facts(engine, client):
    engine.info = msgspec.structs.replace(engine.info, facts=FACTS, rank_states=[
        RankState(rank=0, active_memory=5_000_000_000), RankState(rank=1, active_memory=4_000_000_000)])
    details = {"parent_model": "", "format": "safetensors", "family": "qwen3", "families": ["qwen3"],
               "parameter_size": "7.6B", "quantization_level": "int4"}
    (listed,) = (await client.get("/api/tags")).json()["models"]
    assert TIMESTAMP.fullmatch(listed.pop("modified_at"))
    assert re.fullmatch(r"[0-9a-f]{64}", listed.pop("digest"))
    assert listed == {"name": "test-model", "model": "test-model", "size": 4_300_000_000, "details": details}

    show = (await client.post("/api/show", json={"model": "test-model:latest"})).json()
    assert show["capabilities"] == ["completion", "tools", "thinking"]
    assert show["details"] == details and show["template"] == "{{ messages }}"
    assert show["model_info"] == {
        "general.architecture": "qwen3", "general.basename": "test-model", "general.parameter_count": 7_615_616_512,
        "qwen3.context_length": 4096, "qwen3.embedding_length": 3584, "qwen3.block_count": 28,
        "qwen3.vocab_size": 152064}
    assert "num_ctx                        4096" in show["parameters"]
    assert "FROM /models/test-model" in show["modelfile"]

    (running,) = (await client.get("/api/ps")).json()["models"]
    assert running["size"] == running["size_vram"] == 9_000_000_000
    assert running["context_length"] == 4096 and running["details"] == details
    assert running["expires_at"] > "2100"


async def test_show_of_an_engine_that_gives_no_facts(engine, client):
    show = (await client.post("/api/show", json={"name": "default"})).json()
    assert show["capabilities"] == ["completion", "tools"]
    assert show["model_info"]["unknown.context_length"] == 4096
    assert show["details"]["parameter_size"] == "" and show["details"]["family"] == ""


async def test_show_without_tool_calling(engine, client):
    engine.info = msgspec.structs.replace(engine.info, facts=ModelFacts(architecture="llama", dtype="bfloat16"))
    show = (await client.post("/api/show", json={"model": "test-model"})).json()
    assert show["capabilities"] == ["completion"] and show["details"]["quantization_level"] == "bfloat16"


async def test_show_errors(engine, client):
    assert_error(await client.post("/api/show", json={"model": "llava"}), 404, "model 'llava' not found")
    assert_error(await client.post("/api/show", json={}), 400, "'model'")


async def test_models_while_the_engine_is_down(make_client):
    async with make_client() as c:
        assert_error(await c.get("/api/tags"), 503, "not known yet")


@pytest.mark.parametrize(("n", "text"), [(7_615_616_512, "7.6B"), (8_000_000_000, "8B"), (135_310_000, "135.31M"),
                                         (213_376, "213K"), (999, "999")])
def test_parameter_size_spelling(n, text):
    assert human_number(n) == text


async def test_an_engine_refusal_names_ollamas_parameters_not_openais(engine, client):
    engine.refuse(ipc.Error(status=400, message="at most 16 stop strings, got 17", param="stop"))
    assert_error(await client.post("/api/chat", json=CHAT), 400, "options.stop")
    engine.refuse(ipc.Error(status=400, code="kv_memory_exceeded", param="max_tokens", message=(
        "this request's KV cache would need ... (3 prompt + 5000 max_tokens, in steps of 256) ...; lower max_tokens, "
        "shorten the prompt or raise KV_MEMORY_BYTES")))
    message = assert_error(await client.post("/api/generate", json=GENERATE), 400, "5000 options.num_predict",
                           "lower options.num_predict")
    assert "max_tokens" not in message
    engine.refuse(ipc.Error(status=400, code="context_length_exceeded", param="messages",
                            message="the prompt has 9 tokens; shorten the prompt"))
    # a prompt, rendered as a chat on the engine; its message says nothing of messages
    assert_error(await client.post("/api/generate", json=GENERATE), 400, "shorten the prompt")
    # the server's own refusals name Ollama's parameters already: left as they are
    assert_error(await client.post("/api/chat", json={**CHAT, "options": {"num_predict": -5}}), 400,
                 "'options.num_predict'")
