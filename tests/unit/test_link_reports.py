"""Links and silent ranks as a person sees them: /health, /metrics, ./launch.sh status and the dashboard's
state (on the fake engine), and the dashboard's models panel read from RUN_DIR's files, broken ones included."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from api.cluster_files import MAX_BYTES, read_models, read_transfer
from ipc.messages import LinkState, RankState

LINK = LinkState(a=0, b=1, host_a="mac-a", host_b="mac-b", latency_seconds=42e-6,
                 bandwidth_bytes_per_second=5.5e9, probe_bytes=4 << 20, probe_seconds=0.0031, measured_at=1.7e9,
                 age=12.0)
RANKS = [RankState(rank=0, host="mac-a", pid=10), RankState(rank=1, host="mac-b", pid=11, unanswered=11.5)]


@pytest.mark.anyio
async def test_health_metrics_and_dashboard_show_the_links_and_name_a_silent_rank(engine, make_client, tmp_path):
    engine.info = msgspec.structs.replace(engine.info, links=[LINK], rank_states=RANKS)
    async with make_client(RUN_DIR=tmp_path) as client:
        await check_reports(client, tmp_path)


async def check_reports(client, run_dir) -> None:
    r = await client.get("/health")
    assert r.status_code == 503
    body = r.json()
    assert body["engine"] == "stalled: rank 1 (mac-b, pid 11) not answering for 12 s (frozen or gone)"
    assert body["links"] == [{"a": 0, "b": 1, "host_a": "mac-a", "host_b": "mac-b",
                              "latency_seconds": 42e-6, "bandwidth_bytes_per_second": 5.5e9,
                              "probe_bytes": 4 << 20, "probe_seconds": 0.0031, "measured_at": 1.7e9, "age": 12.0}]
    text = (await client.get("/metrics")).text
    labels = 'a="0",b="1",host_a="mac-a",host_b="mac-b"'
    assert re.search(rf"^mcs_link_latency_seconds\{{{labels}\}} 4\.2e-05$", text, re.M), text
    assert re.search(rf"^mcs_link_bandwidth_bytes_per_second\{{{labels}\}} 5\.5e\+09$", text, re.M)
    assert re.search(rf"^mcs_link_probe_age_seconds\{{{labels}\}} 12\.0$", text, re.M)
    state = (await client.get("/dashboard/state")).json()
    assert state["health"]["links"] == body["links"] and "rank 1 (mac-b" in state["health"]["engine"]
    assert state["models"] == {"available": False, "note": "run ./launch.sh models", "hosts": []}
    assert state["transfer"] is None
    (run_dir / "models.json").write_text(json.dumps(MODELS))
    state = (await client.get("/dashboard/state")).json()
    assert state["models"]["served"] == "org/tiny" and state["models"]["hosts"][0]["models"][0]["complete"]


@pytest.mark.anyio
async def test_a_rank_that_answered_is_not_named(engine, client):
    quiet = [msgspec.structs.replace(RANKS[1], unanswered=0.4), RANKS[0]]
    engine.info = msgspec.structs.replace(engine.info, rank_states=quiet)
    assert (await client.get("/health")).json()["engine"] == "ok"


def test_status_lists_each_link_and_a_silent_rank():
    from ipc import Info
    from ops.status import describe_info

    info = Info(model="m", model_path="/m", context_length=8, ranks=2, backend="ring", created=0, engine_pid=10,
                rank_states=RANKS, links=[LINK])
    text = describe_info(info)
    assert ("  link 0-1  mac-a - mac-b  latency 42 us  bandwidth 5.50 GB/s  probed 12s ago (4.0 MiB in 3.1 ms)"
            in text.splitlines()), text
    assert re.search(r"rank 1 +mac-b .*NOT ANSWERING for 12s", text)
    assert "NOT ANSWERING" not in [ln for ln in text.splitlines() if "rank 0" in ln][0]
    waiting = describe_info(msgspec.structs.replace(info, links=[]))
    assert "links     not probed yet" in waiting


MODELS = {"updated": 1.7e9, "served": "org/tiny", "hosts": [
    {"host": "mac-a", "ranks": [0], "cache": "/c", "models": [
        {"repo": "org/tiny", "commit": "abc", "revisions": ["abc"], "size": 1000, "total": 1000, "complete": True,
         "manifest": True, "missing": []},
        {"repo": "org/half", "commit": "def", "revisions": [], "size": 10, "total": 99, "complete": False,
         "manifest": False, "missing": ["model.safetensors"]}]},
    {"host": "mac-b", "ranks": [1], "cache": "/c", "models": "not a list"},
    "not a host"], "generated": []}


def test_models_file_read_as_written_and_broken_files_become_a_note(tmp_path):
    assert read_models(tmp_path)["note"] == "run ./launch.sh models"
    (tmp_path / "models.json").write_text(json.dumps(MODELS))
    got = read_models(tmp_path)
    assert got["available"] and got["served"] == "org/tiny" and got["updated"] == 1.7e9
    assert [h["host"] for h in got["hosts"]] == ["mac-a", "mac-b"] and got["hosts"][1]["models"] == []
    half = got["hosts"][0]["models"][1]
    assert (half["repo"], half["complete"], half["missing"], half["size"]) == ("org/half", False, 1, 10)
    nested = "[" * 100_000 + "]" * 100_000  # small enough to be read, too deep for json's recursion
    for broken in ("{not json", json.dumps([1, 2]), json.dumps({"hosts": "x"}), "x" * (MAX_BYTES + 1), nested):
        (tmp_path / "models.json").write_text(broken)
        got = read_models(tmp_path)
        assert not got["available"] and got["note"].endswith("run ./launch.sh models"), got


def test_transfer_progress_read_and_a_dead_writer_shown_as_stale(tmp_path):
    assert read_transfer(tmp_path) is None
    doc = {"model": "org/tiny", "phase": "spread", "bytes_done": 50, "bytes_total": 100, "rate": 10.0,
           "file": "model.safetensors", "hosts": ["mac-b"], "started": 1000.0, "updated": 1005.0, "error": ""}
    (tmp_path / "transfer.json").write_text(json.dumps(doc))
    got = read_transfer(tmp_path, now=1010.0)
    assert (got["phase"], got["bytes_done"], got["hosts"], got["stale"]) == ("spread", 50, ["mac-b"], False)
    assert read_transfer(tmp_path, now=2000.0)["stale"]
    (tmp_path / "transfer.json").write_text(json.dumps({**doc, "phase": "done"}))
    assert not read_transfer(tmp_path, now=2000.0)["stale"]  # a finished transfer is not stale, only old
    (tmp_path / "transfer.json").write_text(json.dumps({**doc, "bytes_done": "many", "hosts": 3}))
    got = read_transfer(tmp_path, now=1010.0)
    assert got["bytes_done"] == 0 and got["hosts"] == []
    (tmp_path / "transfer.json").write_bytes(b"\xff\xfe")
    assert read_transfer(tmp_path) is None
