"""SPREAD_TRANSPORT=rsync: a second rank on this host with a cache of its own is copied here by Python (no
rsync needed); a remote host gets rsync over ssh, played here by a stub ssh that runs the command locally,
then hashes its copy itself. Both: identical files and a manifest, nothing twice, a damaged file replaced,
a full disk refused before any byte."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config.hub_cache import Manifest, manifest_path, repo_folder, snapshot_folder
from tests.harness import REPO, short_dir
from tests.hub_model import COMMIT, REPO_ID, flip_a_byte, hub_model, identical

# The remote host "mac-2" runs here: the stub drops ssh's options and host and runs the command.
SSH_STUB = """#!/usr/bin/env bash
while [[ $1 == -o ]]; do shift 2; done
shift
exec sh -c "$*"
"""


@pytest.fixture
def caches() -> tuple[Path, Path, Manifest]:
    root = short_dir("spread-rs-")
    return root / "r0", root / "r1", hub_model(root / "r0", links=True)


def spread(r0: Path, r1: Path, hosts: str, **more: str) -> subprocess.CompletedProcess:
    root = r0.parent
    (root / "empty.env").touch()
    (root / "bin").mkdir(exist_ok=True)
    (root / "bin" / "ssh").write_text(SSH_STUB)
    (root / "bin" / "ssh").chmod(0o755)
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MCS_SPREAD_TEST_", "HUB_CACHE", "HOST"))}
    env = {**keep, "ENV_FILE": str(root / "empty.env"), "HOSTS": hosts, "HUB_CACHE_PER_RANK": f"{r0},{r1}",
           "SPREAD_TRANSPORT": "rsync", "RUN_DIR": str(root / "run"), "PATH": f"{root / 'bin'}:{os.environ['PATH']}",
           **more}
    return subprocess.run([sys.executable, "-m", "ops.spread", REPO_ID], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=180)


def sent(proc: subprocess.CompletedProcess) -> int:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("spread: bytes_sent=")]
    return int(line.partition("=")[2])


HOSTS = [pytest.param("127.0.0.1,127.0.0.1", id="local-copy"),
         pytest.param("127.0.0.1,mac-2", id="rsync-over-ssh",
                      marks=pytest.mark.needs_tool(shutil.which("rsync") is not None, "rsync (apt-get install rsync)"))]


@pytest.mark.parametrize("hosts", HOSTS)
def test_rsync_transport_copies_verifies_and_replaces_a_damaged_file(caches, hosts):
    r0, r1, manifest = caches
    assert sent(spread(r0, r1, hosts)) == manifest.total_bytes
    assert identical(r0, r1, manifest) and manifest_path(r1, REPO_ID, COMMIT).is_file()
    assert sent(spread(r0, r1, hosts)) == 0
    weights = snapshot_folder(r1, REPO_ID, COMMIT) / "model.safetensors"
    flip_a_byte(weights)
    assert sent(spread(r0, r1, hosts)) == weights.stat().st_size
    assert identical(r0, r1, manifest)


def test_rsync_transport_refuses_a_full_disk_before_copying(caches):
    r0, r1, manifest = caches
    proc = spread(r0, r1, "127.0.0.1,127.0.0.1", MCS_SPREAD_TEST_FREE_BYTES="1:1000", MCS_TEST_HOOKS="1")
    assert proc.returncode == 1
    assert "host 127.0.0.1 (rank 1) needs" in proc.stderr and "(1000 bytes) free" in proc.stderr
    assert not repo_folder(r1, REPO_ID).exists()
