"""vLLM's /tokenize and /detokenize against the real engine and API on the demo model: a chat's count is the
chat endpoint's prompt_tokens, a prompt's tokens decode back to it, and what the engine cannot answer is a 400.
"""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from tests.harness import Stack

VOCAB = 1024  # the demo model's
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Forecast", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": [{"type": "text", "text": "Weather"}, {"type": "text", "text": "in Paris?"}]},
    {"role": "assistant", "content": "Checking.", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.fixture(scope="module")
def http(stack):
    with httpx.Client(base_url=stack.base_url, timeout=120) as c:
        yield c


def tokenize(http: httpx.Client, **body) -> dict:
    r = http.post("/tokenize", json=body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize(("messages", "extra"), [
    ([{"role": "user", "content": "hello"}], {}),
    ([{"role": "user", "content": "hello"}], {"tools": [WEATHER]}),
    (CONVERSATION, {"tools": [WEATHER]}),
])
def test_a_chats_count_is_the_chat_completions_prompt_tokens(http, client, messages, extra):
    counted = tokenize(http, model="default", messages=messages, **extra)
    chat = client.chat.completions.create(model="default", messages=messages, max_tokens=1, **extra)
    assert counted["count"] == len(counted["tokens"]) == chat.usage.prompt_tokens
    assert counted["max_model_len"] == client.models.retrieve("default").model_extra["context_length"]


def test_thinking_off_counts_as_reasoning_effort_none(http, client):
    messages = [{"role": "user", "content": "hello"}]
    off = tokenize(http, messages=messages, chat_template_kwargs={"enable_thinking": False})
    chat = client.chat.completions.create(model="default", messages=messages, max_tokens=1, reasoning_effort="none")
    assert off["count"] == chat.usage.prompt_tokens > tokenize(http, messages=messages)["count"]


def test_the_rendered_chat_ends_where_the_template_says(http):
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hel"}]
    opened = tokenize(http, messages=messages[:1])
    closed = tokenize(http, messages=messages[:1], add_generation_prompt=False)
    assert closed["count"] < opened["count"] and opened["tokens"][:closed["count"]] == closed["tokens"]
    continued = tokenize(http, messages=messages, add_generation_prompt=False, continue_final_message=True)
    text = http.post("/detokenize", json={"tokens": continued["tokens"]}).json()["prompt"]
    assert text.endswith("<|im_start|>assistant\nHel")  # the last message left open, for the model to continue


@pytest.mark.parametrize("prompt", ["Once upon a time, in Paris", "héllo ✓ wörld\n\n\ttabs 🙂", " leading space",
                                    ""])
def test_a_prompts_tokens_detokenize_to_the_prompt(http, prompt):
    tokens = tokenize(http, prompt=prompt, return_token_strs=True)
    assert tokens["count"] == len(tokens["tokens"]) == len(tokens["token_strs"])
    assert all(0 <= t < VOCAB for t in tokens["tokens"])
    r = http.post("/detokenize", json={"model": "default", "tokens": tokens["tokens"]})
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": prompt}


def test_a_prompts_count_is_the_completions_prompt_tokens(http, client):
    prompt = "Once upon a time, in Paris"
    completion = client.completions.create(model="default", prompt=prompt, max_tokens=1)
    assert tokenize(http, prompt=prompt)["count"] == completion.usage.prompt_tokens


@pytest.mark.parametrize(("body", "param"), [
    ({"tokens": [VOCAB]}, "tokens[0]"),
    ({"tokens": [5, 6, VOCAB + 100]}, "tokens[2]"),
    ({"tokens": [-1]}, "tokens[0]"),
])
def test_ids_outside_the_vocabulary_are_400(http, body, param):
    r = http.post("/detokenize", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_more_ids_than_a_context_holds_are_400(http, client):
    context = client.models.retrieve("default").model_extra["context_length"]
    r = http.post("/detokenize", json={"tokens": [1] * (context + 1)})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens", r.text


def test_a_huge_tokenize_does_not_hold_up_generation(http, client):
    """Rank 0 tokenises in a worker thread: while a prompt of MAX_REQUEST_BYTES is tokenised (seconds), chat
    completions keep finishing (the first may have started before it reached the engine; the next cannot)."""
    prompt = "the quick brown fox jumps over the lazy dog, " * (4_000_000 // 46)
    answer: list[httpx.Response] = []
    thread = threading.Thread(target=lambda: answer.append(http.post(
        "/tokenize", content=json.dumps({"prompt": prompt}), headers={"Content-Type": "application/json"})))
    thread.start()
    during = 0
    try:
        while thread.is_alive():
            chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2, temperature=0)
            assert chat.usage.completion_tokens > 0
            during += thread.is_alive()
    finally:
        thread.join(timeout=120)
    assert answer[0].status_code == 200, answer[0].text
    assert answer[0].json()["count"] > 100_000
    assert during >= 2, "chat completions waited for the tokenize"


@pytest.fixture(scope="module")
def small_frames():
    """An engine whose socket frames are small, so an answer can outgrow them."""
    s = Stack(extra={"MAX_FRAME_BYTES": "65536", "MAX_REQUEST_BYTES": "60000"})
    s.procs = {"engine": s.start_engine(), "api": s.start_api()}
    yield s
    for p in s.procs.values():
        p.stop()


def test_an_answer_beyond_the_frame_limit_is_400_and_the_engine_serves_on(small_frames):
    prompt = "".join(chr(0x4E00 + i % 2000) for i in range(15_000))  # rare characters: several tokens each
    with httpx.Client(base_url=small_frames.base_url, timeout=60) as http:
        body = json.dumps({"prompt": prompt, "return_token_strs": True}, ensure_ascii=False).encode()
        r = http.post("/tokenize", content=body, headers={"Content-Type": "application/json"})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == "prompt" and "MAX_FRAME_BYTES" in error["message"]
        assert "return_token_strs" in error["message"]
        assert tokenize(http, prompt="still here")["count"] > 0
