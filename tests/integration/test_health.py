"""/health with a real engine: its details, and the truth when the engine goes away and comes back."""

from __future__ import annotations


import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import wait_for


def metric(base_url: str, name: str) -> float:
    text = httpx.get(base_url + "/metrics", timeout=10).text
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def test_health_details_then_unreachable_then_back(own_stack):
    s = own_stack
    # ranks report about once a second: the first report may still be on its way
    r = wait_for(lambda: (r := httpx.get(s.base_url + "/health", timeout=10)).json().get("rank_states") and r,
                 10, "the first rank report")
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["status"], body["api"], body["engine"]) == ("ok", "ok", "ok")
    assert (body["model"], body["ranks"], body["backend"], body["context_length"]) == ("demo-tiny", 1, "single", 131072)
    assert (body["parallel"], body["pipeline_layers"]) == ("single", [])
    # KV_BITS=off: keys and values in the float type the demo model computes in
    assert {k: body["kv_memory"][k] for k in ("precision", "bits", "group_size")} == {"precision": "fp32", "bits": 0,
                                                                                    "group_size": 0}
    assert body["queued"] == 0 and body["active"] == 0 and body["uptime"] >= 0 and body["api_uptime"] >= 0
    assert 0 <= body["last_step_age"] < body["stall_deadline"]
    (rank,) = body["rank_states"]
    assert rank["rank"] == 0 and rank["pid"] == body["engine_pid"] and rank["host"]
    assert rank["active_memory"] > 0 and rank["host_memory_total"] >= rank["host_memory_available"] > 0
    assert metric(s.base_url, "mcs_engine_up") == 1

    s.procs["engine"].stop()
    r = httpx.get(s.base_url + "/health", timeout=10)
    assert r.status_code == 503
    assert r.json()["api"] == "ok" and r.json()["engine"].startswith("unreachable: ")
    assert httpx.get(s.base_url + "/v1/models", timeout=10).status_code == 200  # from the last Info
    assert metric(s.base_url, "mcs_engine_up") == 0

    s.procs["engine"] = s.start_engine()
    wait_for(lambda: httpx.get(s.base_url + "/health", timeout=10).status_code == 200, 30, "health back to 200")
    assert metric(s.base_url, "mcs_engine_reconnects_total") == 1
