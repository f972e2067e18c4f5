"""Health verdicts, /metrics, the ops-route guard and /dashboard/state against the fake engine."""

from __future__ import annotations

from functools import partial

import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

import ipc
from ipc.messages import RankState
from api import health
from ops.cluster import rdma_matrix_faults

pytestmark = pytest.mark.anyio


def info(**kw) -> ipc.Info:
    base = dict(model="m", model_path="/m", context_length=4096, ranks=2, backend="ring", created=1, engine_pid=10)
    return ipc.Info(**{**base, **kw})


def rank(r: int, age: float) -> RankState:
    return RankState(rank=r, host=f"mac-{r}", pid=100 + r, report_age=age)


@pytest.mark.parametrize(
    ("kw", "verdict"),
    [
        ({}, "ok"),
        ({"rank_states": [rank(0, 0.5), rank(1, 0.5)]}, "ok"),
        ({"last_step_age": 12.4}, "stalled: no step for 12 s"),
        ({"rank_states": [rank(0, 0.5), rank(1, 11.0)]}, "stalled: no report from rank 1 (mac-1, pid 101) for 11 s"),
        ({"rank_states": [rank(0, 11.0), rank(1, 11.0)]},
         "stalled: no rank report for 11 s (the ranks stopped meeting: one is frozen or gone)"),
    ],
)
async def test_engine_verdict(kw, verdict):
    assert health.engine_verdict(info(**kw), deadline=10.0) == verdict


async def test_health_calls_a_silent_engine_stalled(socket_path, make_client, monkeypatch):
    monkeypatch.setattr(health, "INFO_TIMEOUT", 0.2)

    async def silent(conn: ipc.FramedStream) -> None:
        await conn.recv()
        await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        await tg.start(partial(ipc.serve_unix, socket_path, silent))
        async with make_client() as client:
            r = await client.get("/health")
        tg.cancel_scope.cancel()
    assert r.status_code == 503
    assert r.json()["engine"] == "stalled: the engine did not answer an info request within 0.2 s"


async def test_health_names_a_stale_rank(engine, make_client):
    engine.info = msgspec.structs.replace(engine.info, rank_states=[rank(0, 0.1), rank(1, 7.0)])
    async with make_client(HEALTH_STALL_SECONDS=5) as client:
        r = await client.get("/health")
    assert r.status_code == 503
    assert r.json()["engine"] == "stalled: no report from rank 1 (mac-1, pid 101) for 7 s"
    assert r.json()["rank_states"][1]["host"] == "mac-1"


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def test_metrics_count_requests_tokens_and_reconnects(engine, client):
    chat = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
    assert (await client.post("/v1/chat/completions", json=chat)).status_code == 200
    assert (await client.post("/v1/chat/completions", json={**chat, "stream": True})).status_code == 200
    assert (await client.get("/v1/models/test-model")).status_code == 200
    assert (await client.get("/no/such/path")).status_code == 404
    engine.info = msgspec.structs.replace(engine.info, engine_pid=4343)  # another engine process answers now
    s = samples((await client.get("/metrics")).text)
    ep = "/v1/chat/completions"
    assert s[("mcs_requests_total", (("endpoint", ep), ("status", "200")))] == 2
    assert s[("mcs_requests_total", (("endpoint", "/v1/models/{model_id}"), ("status", "200")))] == 1
    assert s[("mcs_requests_total", (("endpoint", "other"), ("status", "404")))] == 1
    assert s[("mcs_prompt_tokens_total", ())] == 14  # the fake engine's 7 per request
    assert s[("mcs_generation_tokens_total", ())] == 4  # "Hello", " world" twice
    assert s[("mcs_time_to_first_token_seconds_count", (("endpoint", ep),))] == 2
    assert s[("mcs_inter_token_latency_seconds_count", ())] == 2
    assert s[("mcs_engine_up", ())] == 1
    assert s[("mcs_engine_reconnects_total", ())] == 1


async def test_metrics_without_an_engine(client):
    r = await client.get("/metrics")
    assert r.status_code == 200
    s = samples(r.text)
    assert s[("mcs_engine_up", ())] == 0
    assert ("mcs_queue_depth", ()) not in s  # no stale engine values


@pytest.mark.parametrize("path", ["/dashboard", "/dashboard/static/dashboard.js"])
async def test_dashboard_shell_loads_without_a_key(engine, make_client, path):
    # A browser cannot send a Bearer header for the page itself; the page holds no data.
    async with make_client(API_KEY="sekret") as client:
        assert (await client.get(path)).status_code == 200


@pytest.mark.parametrize("path", ["/metrics", "/dashboard/state"])
async def test_ops_routes_follow_the_api_key(engine, make_client, path):
    async with make_client(API_KEY="sekret") as client:
        assert (await client.get(path)).status_code == 401
        assert (await client.get(path, headers={"Authorization": "Bearer sekret"})).status_code == 200
        assert (await client.get("/health")).status_code == 200  # always open
    async with make_client(API_KEY="sekret", PROTECT_OPS_ROUTES="false") as client:
        assert (await client.get(path)).status_code == 200


async def test_dashboard_state(engine, client):
    engine.info = msgspec.structs.replace(engine.info, rank_states=[rank(0, 0.2), rank(1, 0.2)])
    chat = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    r = await client.post("/v1/chat/completions", json=chat)
    rid = r.text.split('"id":"', 1)[1].split('"', 1)[0]
    await client.post("/v1/chat/completions", json={**chat, "temperature": 7})
    state = (await client.get("/dashboard/state")).json()
    assert state["health"]["http_status"] == 200 and state["health"]["engine"] == "ok"
    assert [r["rank"] for r in state["health"]["rank_states"]] == [0, 1]
    assert [(x["endpoint"], x["status"]) for x in state["recent"]] == [(
        "/v1/chat/completions", 400), ("/v1/chat/completions", 200)]
    assert state["recent"][1]["id"] == rid and state["recent"][1]["completion_tokens"] == 2
    assert [x["status"] for x in state["errors"]] == [400]
    assert state["generated_total"] == 2 and len(state["tokens_series"]) == 60
    page = await client.get("/dashboard")
    assert page.status_code == 200 and "dashboard.js" in page.text


async def test_rdma_matrix_faults():
    assert rdma_matrix_faults([[None, "a"], ["b", None]]) == []
    assert rdma_matrix_faults([[None, ["a", "c"]], [["b"], None]]) == []
    faults = rdma_matrix_faults([[None, "a"], ["b", "x"], None])
    assert faults == [
        "hostfile rdma row of rank 0 must list 3 entries (one per host), got [None, 'a']",
        "hostfile rdma row of rank 1 must list 3 entries (one per host), got ['b', 'x']",
        "hostfile rdma row of rank 2 must list 3 entries (one per host), got None",
    ]
    assert rdma_matrix_faults([[None, ""], ["b", "b"]]) == [
        "hostfile rdma[0][1] must name the RDMA device from rank 0 to rank 1, got ''",
        "hostfile rdma[1][1] must be null (a host has no link to itself), got 'b'",
    ]
