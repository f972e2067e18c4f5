"""Two ranks over the ring on loopback probe their link when idle: /metrics has the pair's latency and
bandwidth gauges with plausible values, /health lists the link with its age, and a request still answers."""

from __future__ import annotations

import re

import httpx
import openai
import pytest

from tests.harness import Stack, wait_for

pytestmark = pytest.mark.multirank


def gauge(text: str, name: str) -> dict[str, float]:
    """Every sample of one gauge, by its label set as written."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(rf"^{name}\{{(.*)\}} (\S+)$", text, re.M)}


def test_two_idle_ranks_probe_their_link_and_show_it_in_metrics_and_health():
    s = Stack()
    engine = s.start_engine(ranks=2)
    api = s.start_api()
    try:
        get = lambda path: httpx.get(s.base_url + path, timeout=15)  # noqa: E731
        # the first probe runs a couple of seconds after start, once the engine is idle
        links = wait_for(lambda: get("/health").json().get("links") or None, 30, "the first link probe")
        assert [(link["a"], link["b"]) for link in links] == [(0, 1)]
        link = links[0]
        assert 0 < link["latency_seconds"] < 0.05, link  # loopback: tens of microseconds, far below 50 ms
        assert 10e6 < link["bandwidth_bytes_per_second"] < 1e12, link
        assert 0 <= link["age"] < 60 and link["host_a"] and link["host_b"], link
        assert 0 < link["probe_bytes"] <= 4 * 2**20 and 0 < link["probe_seconds"] < 0.5, link

        text = get("/metrics").text
        latency = gauge(text, "mcs_link_latency_seconds")
        bandwidth = gauge(text, "mcs_link_bandwidth_bytes_per_second")
        assert len(latency) == len(bandwidth) == 1, (latency, bandwidth)
        labels = next(iter(latency))
        assert 'a="0"' in labels and 'b="1"' in labels and f'host_a="{link["host_a"]}"' in labels, labels
        assert 0 < latency[labels] < 0.05 and bandwidth[labels] > 10e6, (latency, bandwidth)

        client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4, temperature=0)
        assert r.usage.completion_tokens > 0
        client.close()
        assert engine.alive()
    finally:
        api.stop()
        engine.stop()
