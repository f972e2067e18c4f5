"""A serving JACCL engine holds the Thunderbolt RDMA devices, and a second group opened beside it meets EBUSY:
spreading over the cluster and `check --links` refuse then, in one sentence saying to stop the engine (or, for
spreading, to copy with rsync), before any rank starts; without an engine, or over the ring, they go ahead."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from config import load_settings
from ops.layout import Layout
from ops.link_check import link_check
from ops.pidfile import PidFile
from ops.rank_job import engine_holds_rdma
from ops.spread import spread


@pytest.fixture
def engine(tmp_path):
    """A process that looks like a running engine to ops (its command runs `-m engine`), in its own group."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "-m", "engine"],
                            start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def settings_for(tmp_path, backend: str):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([{"ssh": f"mac-{i}", "ips": [f"10.0.0.{i}"],
                                     "rdma": [None if j == i else "rdma_en2" for j in range(2)]} for i in range(2)]))
    env = {"BACKEND": backend, "HOSTFILE": str(hostfile), "RUN_DIR": str(tmp_path / "run")}
    return load_settings(env, tmp_path / "no.env")


def serve(settings, engine) -> None:
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    PidFile(Layout(settings).engine_pid).write(engine.pid)


def test_spreading_and_the_link_check_refuse_beside_a_serving_jaccl_engine(tmp_path, engine, capsys) -> None:
    settings = settings_for(tmp_path, "jaccl")
    assert not engine_holds_rdma(settings)  # no engine yet
    serve(settings, engine)
    assert spread(settings, manifest=None, hosts=["mac-0", "mac-1"]) == 1
    assert link_check(settings) == 1
    err = capsys.readouterr().err.splitlines()
    assert err == ["spread: the serving engine holds the Thunderbolt RDMA devices that a JACCL spread needs: stop it "
                   "first (./launch.sh stop), or set SPREAD_TRANSPORT=rsync to copy over ssh while it serves",
                   "check --links: the serving engine holds the Thunderbolt RDMA devices that the check's own JACCL "
                   "group needs: stop it first (./launch.sh stop); while it serves, /health shows the links it "
                   "probes itself"]


def test_over_the_ring_a_serving_engine_is_no_obstacle(tmp_path, engine) -> None:
    settings = settings_for(tmp_path, "ring")
    serve(settings, engine)
    assert not engine_holds_rdma(settings)
