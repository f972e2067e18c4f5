"""KV memory admission on the real engine: at its KV budget the engine queues requests instead of growing the
batch, and a request that could never fit gets a 400 naming the numbers while the engine keeps serving.

The demo model's token takes 1024 bytes of KV (2 layers x K and V x 4 heads x 16 x float32), as the engine
measures from its caches at load, so with a 4 MiB budget four sequences of up to 1024 tokens run at once.
"""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import pytest

from tests.harness import Stack, wait_for

BUDGET = 4 << 20
TOKEN_BYTES = 2 * 2 * 4 * 16 * 4
# every token the demo model's EOS ids could end a choice with is banned: each runs to max_tokens
NO_EOS = {"0": -100, "2": -100}


@pytest.fixture(scope="module")
def stack():
    s = Stack(extra={"KV_MEMORY_BYTES": str(BUDGET), "MAX_TOKENS_DEFAULT": "0"})
    engine, api = s.start_engine(), s.start_api()
    yield s
    api.stop()
    engine.stop()


@pytest.fixture(scope="module")
def client(stack):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=300) as c:
        yield c


def ask(client, text: str, max_tokens: int, **kw):
    return client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}],
                                          max_tokens=max_tokens, logit_bias=NO_EOS, temperature=0, **kw)


def test_the_engine_reports_its_kv_budget_and_the_size_of_a_token(stack):
    info = stack.probe()
    assert (info["kv_budget_bytes"], info["kv_token_bytes"], info["kv_reserved_bytes"]) == (BUDGET, TOKEN_BYTES, 0)
    health = httpx.get(stack.base_url + "/health", timeout=10).json()
    assert health["kv_memory"] == {"budget_bytes": BUDGET, "reserved_bytes": 0, "token_bytes": TOKEN_BYTES,
                                   "window_token_bytes": 0, "window_tokens": 0, "constant_bytes": 0,
                                   "measured": True, "precision": "fp32", "bits": 0, "group_size": 0}
    metrics = httpx.get(stack.base_url + "/metrics", timeout=10).text
    values = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line.startswith("mcs_kv_"))
    assert values.pop('mcs_kv_cache_info{bits="0",group_size="0",precision="fp32"}') == "1.0"
    assert {k: float(v) for k, v in values.items()} == {
        "mcs_kv_budget_bytes": BUDGET, "mcs_kv_reserved_bytes": 0, "mcs_kv_token_bytes": TOKEN_BYTES,
        "mcs_kv_window_token_bytes": 0, "mcs_kv_window_tokens": 0, "mcs_kv_constant_bytes": 0}
    log = "".join(p.read_text(errors="replace") for p in stack.root.glob("engine-*.log"))
    assert "KV memory measured" in log and f"{TOKEN_BYTES} bytes per token" in log


def test_the_estimate_covers_the_kv_the_engine_actually_keeps(stack, client):
    before = stack.probe()["prompt_cache_bytes"]
    done = ask(client, "Measure me.", 300)
    # the finished sequence's KV is now a prefix cache entry: every token fed to the model, measured by MLX
    fed = done.usage.prompt_tokens + done.usage.completion_tokens - 1
    held = wait_for(lambda: (stack.probe()["prompt_cache_bytes"] - before) or None, 30, "the entry to be stored")
    assert fed * TOKEN_BYTES <= held <= -(-fed // 256) * 256 * TOKEN_BYTES


def test_at_its_budget_the_engine_queues_instead_of_growing_and_everything_finishes(stack, client):
    # each sequence reserves 1024 tokens (a short prompt + 1000): 1 MiB, four at a time in 4 MiB
    seen: list[dict] = []

    def crowded():
        info = stack.probe()
        seen.append(info)
        return info["queued"] > 0 and info["active"] == 4

    with cf.ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(ask, client, f"Story {i}.", 1000) for i in range(8)]
        wait_for(crowded, 120, "four sequences running and the rest queued")
        while not all(f.done() for f in futures):
            seen.append(stack.probe())
        results = [f.result() for f in futures]
    assert [r.usage.completion_tokens for r in results] == [1000] * 8
    assert all(r.choices[0].finish_reason == "length" for r in results)
    assert max(i["kv_reserved_bytes"] for i in seen) == BUDGET
    assert all(i["kv_reserved_bytes"] <= BUDGET and i["active"] <= 4 for i in seen)
    assert stack.probe()["kv_reserved_bytes"] == 0


def test_a_request_that_can_never_fit_gets_400_naming_the_numbers_and_the_engine_keeps_serving(stack, client):
    openai = pytest.importorskip("openai")
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, "Too long.", 5000)
    err = refused.value
    assert err.code == "kv_memory_exceeded" and err.param == "max_tokens"
    for text in (str(BUDGET), "5000 max_tokens", f"{TOKEN_BYTES} bytes per token", "lower max_tokens",
                 "shorten the prompt", "raise KV_MEMORY_BYTES"):
        assert text in err.message, text
    with pytest.raises(openai.BadRequestError) as choices:
        ask(client, "Five of them.", 1000, n=5)  # each fits, all five together do not
    assert choices.value.code == "kv_memory_exceeded" and "fewer choices (n)" in choices.value.message
    anthropic = httpx.post(stack.base_url + "/v1/messages", timeout=60, json={
        "model": "default", "max_tokens": 5000, "messages": [{"role": "user", "content": "Too long."}]})
    assert anthropic.status_code == 400 and "KV_MEMORY_BYTES" in anthropic.json()["error"]["message"]
    # each dialect's refusal names the parameter its client sent
    responses = httpx.post(stack.base_url + "/v1/responses", timeout=60,
                           json={"model": "default", "max_output_tokens": 5000, "input": "Too long."})
    assert responses.status_code == 400 and responses.json()["error"]["param"] == "max_output_tokens"
    assert "lower max_output_tokens" in responses.json()["error"]["message"]
    ollama = httpx.post(stack.base_url + "/api/chat", timeout=60, json={
        "model": "default", "stream": False, "options": {"num_predict": 5000},
        "messages": [{"role": "user", "content": "Too long."}]})
    assert ollama.status_code == 400 and "lower options.num_predict" in ollama.json()["error"]
    assert ask(client, "Still here?", 20).choices[0].finish_reason == "length"


def prompt_of(stack, tokens: int) -> tuple[str, int]:
    """A user message whose chat prompt is close to `tokens` tokens, and its exact count."""
    def count(text: str) -> int:
        r = httpx.post(stack.base_url + "/tokenize", timeout=60,
                       json={"model": "default", "messages": [{"role": "user", "content": text}]})
        return r.json()["count"]

    per_thousand_words = count(" ".join(f"w{i}" for i in range(1000)))
    text = " ".join(f"w{i % 1000}" for i in range(tokens * 1000 // per_thousand_words))
    return text, count(text)


def test_without_a_client_limit_the_answer_runs_to_what_the_budget_leaves_in_every_dialect(stack, client):
    """Chat without max_tokens, Responses without max_output_tokens (Codex), Ollama's num_predict -1: the
    server's own ceiling is fitted to the KV budget, never refused for it."""
    text, prompt = prompt_of(stack, 3800)
    room = BUDGET // TOKEN_BYTES - prompt  # 4096 tokens in all
    assert 0 < room < 512
    chat = client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}],
                                          logit_bias=NO_EOS, temperature=0)
    assert chat.usage.prompt_tokens == prompt
    assert (chat.choices[0].finish_reason, chat.usage.completion_tokens) == ("length", room)
    responses = httpx.post(stack.base_url + "/v1/responses", timeout=300,
                           json={"model": "default", "input": text, "temperature": 0})
    assert responses.status_code == 200, responses.text
    assert responses.json()["usage"]["output_tokens"] <= room
    ollama = httpx.post(stack.base_url + "/api/chat", timeout=300, json={
        "model": "default", "stream": False, "messages": [{"role": "user", "content": text}],
        "options": {"num_predict": -1, "temperature": 0}})
    assert ollama.status_code == 200, ollama.text
    assert ollama.json()["done"] and ollama.json()["eval_count"] <= room


def test_a_prompt_that_alone_outgrows_the_budget_is_refused_naming_the_prompt_not_a_limit_never_sent(stack, client):
    openai = pytest.importorskip("openai")
    text, prompt = prompt_of(stack, 5000)
    assert prompt > BUDGET // TOKEN_BYTES
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": text}])
    err = refused.value
    assert err.code == "kv_memory_exceeded" and err.param == "messages"
    assert "shorten the prompt" in err.message and "lower max_tokens" not in err.message
