"""Several tenants, one operator: a tenant's key never reads the dashboard, /metrics or the ranks' details, and the
open /health says only what a load balancer needs."""

from __future__ import annotations

import msgspec
import pytest

from ipc.messages import RankState

pytestmark = pytest.mark.anyio

CHAT = {"model": "test-model", "messages": [{"role": "user", "content": "hi"}]}
OPS = ["/dashboard/state", "/metrics", "/health/detail"]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
def keys(tmp_path):
    tenants, operators = tmp_path / "keys.txt", tmp_path / "admin.txt"
    tenants.write_text("tenant-a\ntenant-b\n")
    operators.write_text("# the operators\noperator\n")
    return {"API_KEYS_FILE": str(tenants), "ADMIN_API_KEYS_FILE": str(operators)}


@pytest.fixture
def ranks(engine):
    engine.info = msgspec.structs.replace(engine.info, rank_states=[
        RankState(rank=r, host=f"mac-{r}", pid=100 + r, report_age=0.2) for r in (0, 1)])


async def test_a_tenants_key_reads_no_ops_route_and_the_operators_does(engine, ranks, make_client, keys):
    async with make_client(**keys) as client:
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer("tenant-a"))).status_code == 200
        for path in OPS:
            r = await client.get(path, headers=bearer("tenant-b"))
            assert r.status_code == 403, (path, r.text)
            assert "ADMIN_API_KEYS_FILE" in r.json()["error"]["message"]
            assert (await client.get(path)).status_code == 401
            assert (await client.get(path, headers=bearer("operator"))).status_code == 200, path
        state = (await client.get("/dashboard/state", headers=bearer("operator"))).json()
        assert [x["status"] for x in state["recent"]] == [200]
        # the dashboard's chat box streams with the operator's key
        assert (await client.post("/v1/chat/completions", json=CHAT, headers=bearer("operator"))).status_code == 200


async def test_the_open_health_keeps_the_ranks_hosts_and_traffic_for_the_operator(engine, ranks, make_client, keys):
    async with make_client(**keys) as client:
        r = await client.get("/health")
        assert r.status_code == 200 and r.json() == {"status": "ok", "api": "ok", "engine": "ok"}
        detail = (await client.get("/health/detail", headers=bearer("operator"))).json()
        assert [(x["host"], x["pid"]) for x in detail["rank_states"]] == [("mac-0", 100), ("mac-1", 101)]
        assert "prompt_cache" in detail


async def test_several_tenants_and_no_operator_file_is_refused_with_the_fix(engine, make_client, keys):
    async with make_client(API_KEYS_FILE=keys["API_KEYS_FILE"]) as client:
        r = await client.get("/dashboard/state", headers=bearer("tenant-a"))
        assert r.status_code == 403 and "set ADMIN_API_KEYS_FILE" in r.json()["error"]["message"]


async def test_without_keys_health_keeps_its_details(engine, ranks, client):
    body = (await client.get("/health")).json()
    assert body["rank_states"][1]["host"] == "mac-1"
    assert (await client.get("/health/detail")).json()["rank_states"] == body["rank_states"]


def test_an_unreadable_operators_file_stops_the_start_naming_it(tmp_path):
    from config import ConfigError, load_settings
    from config.keys import api_keys

    settings = load_settings({"ADMIN_API_KEYS_FILE": str(tmp_path / "none.txt")}, "/nonexistent/.env")
    with pytest.raises(ConfigError, match="^ADMIN_API_KEYS_FILE=.* cannot be read"):
        api_keys(settings)
