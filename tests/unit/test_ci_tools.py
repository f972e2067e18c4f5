"""Under CI=true a tool the tests drive (rsync, chromium) that is missing fails the run: at .ci/run's install step,
and in the tests that would otherwise skip. On a developer's machine both stay a note and a skip."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def install(tmp_path: Path, ci: str) -> subprocess.CompletedProcess:
    """.ci/install.sh with nothing on PATH: no rsync and no apt-get to install it."""
    env = {"PATH": str(tmp_path), "HOME": str(tmp_path), "CI": ci}
    return subprocess.run(["/bin/bash", ".ci/install.sh", "rsync", "rsync", "the rsync test"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_ci_run_stops_at_the_install_step_when_a_tool_cannot_be_installed(tmp_path):
    r = install(tmp_path, "true")
    assert r.returncode == 1 and "CI=true needs it for the rsync test" in r.stderr, r.stdout + r.stderr
    r = install(tmp_path, "")
    assert r.returncode == 0 and "the rsync test will be skipped" in r.stdout, r.stdout + r.stderr


def test_under_ci_the_rsync_test_fails_instead_of_skipping_without_rsync(tmp_path):
    # no plugin autoload: hypothesis' and langsmith's plugins would take seconds, and this test needs neither
    env = {**os.environ, "PATH": str(tmp_path), "CI": "true", "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    r = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--no-header",
                        "tests/integration/test_spread_rsync.py::test_rsync_transport_copies_verifies_and_replaces_a_damaged_file"
                        "[rsync-over-ssh]"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "rsync (apt-get install rsync) is missing and CI=true" in r.stdout, r.stdout[-2000:]
