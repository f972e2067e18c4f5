"""`./launch.sh check --links` on two local ranks over the ring: every rank meets over the plan channel built on
mlx-lm's generation stream as the engine does and probes its link; the pair's latency and bandwidth are printed,
and a rank that fails ends the check with exit 1 and one sentence naming it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from ops.procs import free_port_run
from tests.harness import REPO, short_dir

pytestmark = pytest.mark.multirank


def check_links(**more: str) -> subprocess.CompletedProcess:
    root = short_dir("links-")
    (root / "empty.env").touch()
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MCS_", "HOST"))}
    env = {**keep, "ENV_FILE": str(root / "empty.env"), "HOSTS": "127.0.0.1,127.0.0.1", "BACKEND": "ring",
           "RING_PORT": str(free_port_run(4)), "RUN_DIR": str(root / "run"), "LOG_DIR": str(root / "logs"), **more}
    return subprocess.run([sys.executable, "-m", "ops", "check", "--links"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)


def test_check_links_prints_each_pairs_latency_and_bandwidth_and_names_a_failing_rank():
    ok = check_links()
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "2 ranks over ring" in ok.stdout
    m = re.search(r"^0-1 +\S+ - \S+ +(\d+) us +([\d.]+) GB/s +4 MiB in [\d.]+ ms$", ok.stdout, re.M)
    assert m, ok.stdout
    assert 0 < int(m.group(1)) < 50_000 and 0.01 < float(m.group(2)) < 1000, ok.stdout  # loopback, a busy host

    failed = check_links(MCS_LINKS_TEST_EXIT="1:3", MCS_TEST_HOOKS="1")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert failed.stderr.strip().splitlines()[-1] == (
        "check --links: the link check failed: rank 1 (127.0.0.1) exited with code 3: test hook: exiting with 3")
