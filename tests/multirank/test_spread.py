"""Spreading a model from rank 0's cache to rank 1's over the ring backend, two local ranks with caches of
their own: byte-identical files and a manifest, nothing re-sent, a killed spread resumed inside a file, a
damaged file replaced, a full disk refused before any byte, a dying rank named."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from config.hub_cache import Manifest, manifest_path, repo_folder, scan, snapshot_folder
from ops.procs import free_port_run
from ops.progress import read_state
from tests.harness import REPO, short_dir, wait_for
from tests.hub_model import COMMIT, REPO_ID, flip_a_byte, hub_model, identical

pytestmark = pytest.mark.multirank

CHUNK = 64 * 1024  # the zoo model's 0.9 MB weights make 15 chunks


@pytest.fixture
def caches() -> tuple[Path, Path, Manifest]:
    """Rank 0's cache holding a zoo model whole (manifest written), rank 1's empty."""
    root = short_dir("spread-")
    return root / "r0", root / "r1", hub_model(root / "r0", links=True)


def env(r0: Path, r1: Path, **more: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("MCS_SPREAD_TEST_", "HUB_CACHE", "HOST"))}
    (r0.parent / "empty.env").touch()
    return {**keep, "ENV_FILE": str(r0.parent / "empty.env"), "HOSTS": "127.0.0.1,127.0.0.1", "HUB_CACHE_PER_RANK": f"{r0},{r1}", "BACKEND": "ring",
            "RING_PORT": str(free_port_run(4)), "RUN_DIR": str(r0.parent / "run"), "WATCHDOG_TIMEOUT": "30",
            "PYTHONUNBUFFERED": "1", **more}


def spread(r0: Path, r1: Path, **more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ops.spread", REPO_ID, "--chunk-bytes", str(CHUNK)], cwd=REPO,
                          env=env(r0, r1, **more), capture_output=True, text=True, timeout=180)


def sent(proc: subprocess.CompletedProcess) -> int:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if x.startswith("spread: bytes_sent=")]
    return int(line.split()[1].partition("=")[2])


def test_spread_copies_every_file_then_a_second_run_moves_nothing(caches):
    r0, r1, manifest = caches
    port = free_port_run(4)
    # an engine serving meanwhile holds RING_PORT and RING_PORT+1: the spread takes the ports above
    with socket.create_server(("127.0.0.1", port)), socket.create_server(("127.0.0.1", port + 1)):
        assert sent(spread(r0, r1, RING_PORT=str(port))) == manifest.total_bytes
    assert identical(r0, r1, manifest)
    assert manifest_path(r1, REPO_ID, COMMIT).is_file()
    [listed] = scan(r1)
    assert (listed.repo, listed.complete, listed.revisions) == (REPO_ID, True, ["main"])
    assert sent(spread(r0, r1)) == 0


def test_a_killed_spread_resumes_without_resending_what_arrived(caches):
    r0, r1, manifest = caches
    blobs = repo_folder(r1, REPO_ID) / "blobs"
    # rank 0 pauses after config.json, generation_config.json and 2 chunks of model.safetensors
    with open(r0.parent / "killed.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "ops.spread", REPO_ID, "--chunk-bytes", str(CHUNK)],
                                cwd=REPO, env=env(r0, r1, MCS_SPREAD_TEST_PAUSE="0:4", MCS_TEST_HOOKS="1"), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def arrived() -> bool:
            whole = [p for p in blobs.glob("*") if not p.name.endswith(".incomplete")]
            partial = [p for p in blobs.glob("*.incomplete") if p.stat().st_size >= CHUNK]
            return bool(whole and partial)

        wait_for(arrived, 60, "a whole file and part of the next on rank 1")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert not manifest_path(r1, REPO_ID, COMMIT).exists()
    held = sum(p.stat().st_size for p in blobs.glob("*"))
    assert 0 < held < manifest.total_bytes
    assert sent(spread(r0, r1)) == manifest.total_bytes - held
    assert identical(r0, r1, manifest) and manifest_path(r1, REPO_ID, COMMIT).is_file()


def test_a_flipped_byte_on_rank_1_is_found_and_replaced(caches):
    r0, r1, manifest = caches
    sent(spread(r0, r1))
    weights = snapshot_folder(r1, REPO_ID, COMMIT) / "model.safetensors"
    flip_a_byte(weights)
    assert sent(spread(r0, r1)) == weights.stat().st_size
    assert identical(r0, r1, manifest)


def test_a_rank_without_room_is_refused_before_anything_is_copied(caches):
    r0, r1, manifest = caches
    proc = spread(r0, r1, MCS_SPREAD_TEST_FREE_BYTES="1:1000", MCS_TEST_HOOKS="1")
    assert proc.returncode == 1
    [line] = [x for x in proc.stderr.splitlines() if x.startswith("spread: host")]
    assert f"host 127.0.0.1 (rank 1) needs" in line and f"({manifest.total_bytes} bytes)" in line
    assert "(1000 bytes) free" in line
    assert not (repo_folder(r1, REPO_ID) / "blobs").exists()
    state = read_state(r0.parent / "run")  # what the dashboard shows
    assert state is not None and (state.phase, state.error) == ("failed", line.removeprefix("spread: "))


def test_a_rank_that_dies_ends_the_spread_with_a_sentence(caches):
    r0, r1, manifest = caches
    proc = spread(r0, r1, MCS_SPREAD_TEST_EXIT="1:3", MCS_TEST_HOOKS="1")
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1].startswith("spread: the spread failed: rank 1 (127.0.0.1) was killed by "
                                                   "SIGKILL"), proc.stderr[-2000:]
    assert not manifest_path(r1, REPO_ID, COMMIT).exists()
