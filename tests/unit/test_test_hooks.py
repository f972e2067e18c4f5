"""The test-only fault hooks stay inert without MCS_TEST_HOOKS=1: never forwarded to other hosts' ranks, and /health
says when an engine reads them."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from config import load_settings
from ops.spread import ClusterSpread

HOOKED = {"MCS_SPREAD_TEST_FREE_BYTES": "1:1000", "ENGINE_FAILPOINT": "step:7"}


def forwarded_env(monkeypatch, **env: str) -> list[str]:
    """The --env values of the mlx.launch line a spread over two hosts starts."""
    monkeypatch.delenv("MCS_TEST_HOOKS", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings({"HOSTS": "127.0.0.1,127.0.0.2"}, "/nonexistent/.env")
    spread = ClusterSpread(settings, None, ["127.0.0.1", "127.0.0.2"], 1 << 20, "sendrecv")
    cmd = spread.job(Path("/nonexistent/manifest.json")).command(5000)
    return [value for flag, value in zip(cmd, cmd[1:]) if flag == "--env"]


def test_a_stray_hook_in_the_environment_does_not_reach_the_other_ranks(monkeypatch):
    sent = forwarded_env(monkeypatch, **HOOKED)
    assert not [v for v in sent if v.startswith(("MCS_SPREAD_TEST_", "ENGINE_FAILPOINT", "MCS_TEST_HOOKS"))], sent


def test_with_the_switch_the_hooks_and_the_switch_travel(monkeypatch):
    sent = forwarded_env(monkeypatch, **HOOKED, MCS_TEST_HOOKS="1")
    assert {"MCS_SPREAD_TEST_FREE_BYTES=1:1000", "ENGINE_FAILPOINT=step:7", "MCS_TEST_HOOKS=1"} <= set(sent)


@pytest.mark.anyio
async def test_health_says_when_the_engine_reads_test_hooks(engine, make_client, client, tmp_path):
    assert "test_hooks" not in (await client.get("/health")).json()
    engine.info = msgspec.structs.replace(engine.info, test_hooks=True)
    assert (await client.get("/health")).json()["test_hooks"] is True
    (tmp_path / "keys").write_text("a\nb\n")
    async with make_client(API_KEYS_FILE=str(tmp_path / "keys")) as keyed:  # the open summary says it too
        assert (await keyed.get("/health")).json()["test_hooks"] is True
