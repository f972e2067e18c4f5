"""/metrics parsed with prometheus_client's parser: counters move by exactly what known requests did."""

from __future__ import annotations

import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


def scrape(stack) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted labels): value} of one scrape."""
    with urllib.request.urlopen(stack.base_url + "/metrics", timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        text = r.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_counters_move_by_what_the_requests_did(stack, client):
    before = scrape(stack)
    usages = []
    for n in (5, 9):
        r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": f"count {n}"}],
                                           max_tokens=n, temperature=0)
        usages.append(r.usage)
    chunks = list(client.completions.create(model="default", prompt="once upon a time", max_tokens=7, stream=True,
                                            stream_options={"include_usage": True}))
    stream_usage = chunks[-1].usage
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="default", messages=[{"role": "user", "content": "x"}], temperature=9)
    after = scrape(stack)

    def delta(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert delta("mcs_requests_total", endpoint=CHAT, status="200") == 2
    assert delta("mcs_requests_total", endpoint=COMPLETIONS, status="200") == 1
    assert delta("mcs_requests_total", endpoint=CHAT, status="400") == 1
    prompt = sum(u.prompt_tokens for u in usages) + stream_usage.prompt_tokens
    generated = sum(u.completion_tokens for u in usages) + stream_usage.completion_tokens
    assert delta("mcs_prompt_tokens_total") == prompt
    assert delta("mcs_generation_tokens_total") == generated
    # one TTFT and one end-to-end latency per admitted request; the refused one is in neither
    assert delta("mcs_time_to_first_token_seconds_count", endpoint=CHAT) == 2
    assert delta("mcs_time_to_first_token_seconds_count", endpoint=COMPLETIONS) == 1
    assert delta("mcs_e2e_request_latency_seconds_count", endpoint=CHAT) == 2
    assert delta("mcs_e2e_request_latency_seconds_bucket", endpoint=CHAT, le="+Inf") == 2
    assert 0 < delta("mcs_time_to_first_token_seconds_sum", endpoint=CHAT) < delta(
        "mcs_e2e_request_latency_seconds_sum", endpoint=CHAT)
    # a gap per token after each request's first
    assert generated - 3 * 2 <= delta("mcs_inter_token_latency_seconds_count") <= generated - 3
    # the engine's cumulative step and broadcast timings, rated by Prometheus
    assert delta("mcs_engine_step_seconds_count") >= max(u.completion_tokens for u in [*usages, stream_usage])
    assert delta("mcs_engine_step_seconds_sum") > 0
    assert delta("mcs_engine_plan_broadcast_seconds_count") >= delta("mcs_engine_step_seconds_count")


def test_engine_gauges(stack):
    samples = scrape(stack)
    assert value(samples, "mcs_engine_up") == 1
    assert value(samples, "mcs_queue_depth") == 0
    assert value(samples, "mcs_active_sequences") == 0
    info = [labels for (name, labels) in samples if name == "mcs_engine_info"]
    assert dict(info[0])["model"] == "demo-tiny"
    (kv_cache,) = [dict(labels) for (name, labels) in samples if name == "mcs_kv_cache_info"]
    assert kv_cache == {"precision": "fp32", "bits": "0", "group_size": "0"}

    def rank0(metric: str) -> dict[str, float]:
        return {dict(labels)["kind"]: v for (name, labels), v in samples.items()
                if name == metric and dict(labels)["rank"] == "0"}

    memory = rank0("mcs_rank_memory_bytes")
    assert memory.keys() == {"active", "cache", "peak"} and memory["active"] > 0
    host = rank0("mcs_rank_host_memory_bytes")
    assert host["total"] >= host["available"] > 0
    assert 0 <= value(samples, "mcs_engine_last_step_age_seconds") < 5
