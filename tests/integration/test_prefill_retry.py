"""A client that gives up during a long prefill and retries (Claude Code after its 300 s timeout) gets its answer:
the tokens the first attempt fed stay in the prefix cache, the retry computes only the rest, and answers as a
cold run does. Anthropic's Messages API, streamed, as Claude Code sends it.
"""

from __future__ import annotations

import json

import httpx
import pytest

from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Stack, wait_for

CHUNK = 32  # PREFILL_TOKENS_PER_STEP: the prefill spans over a hundred steps
# the steps the first attempt is given before it leaves: 512 tokens fed, twice what is worth keeping
# (PARTIAL_MIN_TOKENS, engine/rank0/prefix_index.py)
FED_STEPS = 16
# ~3700 demo tokens of instructions: an agent's long prompt
SYSTEM = " ".join(f"Rule {i}: keep the answer short, cite file {i % 17}.py and never guess." for i in range(110))
# keys apart: the cold run's entries are another tenant's, so the retry can only reuse what its first attempt fed
KEY, COLD_KEY, ADMIN = "sk-prefill-retry-0001", "sk-prefill-cold-0002", "sk-prefill-admin-0003"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY}\n{COLD_KEY}\n")
    admin = keys.with_name("admin.txt")  # /metrics, where the test watches the prefill go
    admin.write_text(f"{ADMIN}\n")
    s = Stack(extra={"API_KEYS_FILE": str(keys), "ADMIN_API_KEYS_FILE": str(admin),
                     "PREFILL_TOKENS_PER_STEP": str(CHUNK)})
    engine, api = s.start_engine(), s.start_api()
    yield s
    api.stop()
    engine.stop()


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=10).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def body(stream: bool) -> dict:
    return {"model": "default", "max_tokens": 8, "temperature": 0, "system": SYSTEM, "stream": stream,
            "messages": [{"role": "user", "content": "Which file does rule 200 cite?"}]}


def streamed(stack: Stack, key: str) -> tuple[str, dict]:
    """A whole streamed answer: its text and its usage (message_start's, updated by message_delta's)."""
    text, usage = "", {}
    with httpx.stream("POST", stack.base_url + "/v1/messages", json=body(True), headers={"x-api-key": key},
                      timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "message_start":
                usage.update(event["message"]["usage"])
            elif event["type"] == "content_block_delta" and event["delta"]["type"] == "text_delta":
                text += event["delta"]["text"]
            elif event["type"] == "message_delta":
                usage.update(event["usage"])
    return text, usage


def test_a_retry_after_the_client_gave_up_mid_prefill_reuses_what_was_fed(stack):
    url = stack.base_url
    cold = httpx.post(url + "/v1/messages", json=body(False), headers={"x-api-key": COLD_KEY}, timeout=60)
    assert cold.status_code == 200, cold.text
    prompt = cold.json()["usage"]["input_tokens"]
    assert cold.json()["usage"]["cache_read_input_tokens"] == 0 and prompt > 100 * CHUNK, cold.json()["usage"]
    cold_text = "".join(b["text"] for b in cold.json()["content"] if b["type"] == "text")

    # the first attempt: it joins the batch (message_start), the engine prefills a few hundred tokens, it gives up
    with httpx.stream("POST", url + "/v1/messages", json=body(True), headers={"x-api-key": KEY}, timeout=30) as r:
        assert r.status_code == 200
        # message_start comes once the request has joined the batch (a read bounded by the client's timeout); the
        # line iterator stays referenced: collected, it would close the stream there and then
        lines = r.iter_lines()
        assert "message_start" in next(line for line in lines if line.startswith("data: "))
        joined = metric(url, "mcs_engine_steps_total")
        # one request in the batch: each step feeds it CHUNK more prompt tokens
        wait_for(lambda: metric(url, "mcs_engine_steps_total") >= joined + FED_STEPS, 30, "the prefill to go on")
    wait_for(lambda: metric(url, "mcs_active_sequences") == 0, 30, "the engine to drop the first attempt")

    text, usage = streamed(stack, KEY)
    reused = usage["cache_read_input_tokens"]
    assert usage["input_tokens"] + reused == prompt
    # at least what the first attempt had fed when it left, not its whole prompt (it was cut mid-prefill)
    assert FED_STEPS * CHUNK <= reused < prompt - 1, usage
    assert text == cold_text
