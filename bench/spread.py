"""Spreading throughput over the cluster's transport against a plain file copy, on this machine, in one run.

A generated file (random bytes, --size-mb) sits in rank 0's cache as a model with its manifest; each run
empties rank 1's cache and spreads it with `python -m ops.spread` on two local ranks over the ring
backend, by send/recv and by all_sum; `shutil.copyfile` copies the same file on the same disk. Every
cell reads `best (median)` over --runs. "stream" is rank 0's time from the first chunk queued to the
last one received (rank 1 hashes as it writes, so that includes its sha256); "end to end" is the whole
command: mlx.launch and both ranks starting, the caches checked, the manifest written.

    .venv/bin/python -m bench.spread                 # 256 MB, 3 runs of each
    .venv/bin/python -m bench.spread --size-mb 512 --runs 5
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from config.hub_cache import Manifest, ManifestFile, sha256_file, snapshot_folder, write_manifest
from ipc.spread import decode_result
from ops.procs import free_port_run
from ops.spread import RESULT_FILE

REPO = Path(__file__).resolve().parent.parent
REPO_ID = "bench/spread"
COMMIT = "b" * 40
BLOCK = 8 << 20


def make_model(cache: Path, size: int) -> Manifest:
    snap = snapshot_folder(cache, REPO_ID, COMMIT)
    snap.mkdir(parents=True)
    path = snap / "model.safetensors"
    with open(path, "wb") as f:
        left = size
        while left:
            n = min(BLOCK, left)
            f.write(os.urandom(n))
            left -= n
    manifest = Manifest(REPO_ID, "main", COMMIT, (ManifestFile(path.name, size, sha256_file(path)),))
    write_manifest(cache, manifest)
    return manifest


def spread_once(root: Path, via: str, chunk: int) -> tuple[float, float]:
    """(stream seconds, end-to-end seconds) of one spread into an empty rank 1 cache."""
    shutil.rmtree(root / "r1", ignore_errors=True)
    (root / "empty.env").touch()
    env = {**os.environ, "ENV_FILE": str(root / "empty.env"), "HOSTS": "127.0.0.1,127.0.0.1", "BACKEND": "ring",
           "HUB_CACHE_PER_RANK": f"{root / 'r0'},{root / 'r1'}", "RING_PORT": str(free_port_run(4)),
           "RUN_DIR": str(root / "run")}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "ops.spread", REPO_ID, "--via", via, "--chunk-bytes", str(chunk)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"spread --via {via} failed:\n{r.stdout}{r.stderr}")
    result = decode_result((root / "run" / RESULT_FILE).read_bytes())
    return result.seconds, wall


def copy_once(root: Path) -> float:
    src = snapshot_folder(root / "r0", REPO_ID, COMMIT) / "model.safetensors"
    dest = root / "copy.bin"
    dest.unlink(missing_ok=True)
    t0 = time.perf_counter()
    shutil.copyfile(src, dest)
    return time.perf_counter() - t0


def cell(size: int, seconds: list[float]) -> str:
    rates = sorted((size / s / 1e6 for s in seconds), reverse=True)
    return f"{rates[0]:.0f} ({statistics.median(rates):.0f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size-mb", type=int, default=256)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--chunk-mb", type=int, default=64)
    args = p.parse_args()
    size, chunk = args.size_mb << 20, args.chunk_mb << 20
    with tempfile.TemporaryDirectory(prefix="mcs-bench-spread-") as tmp:
        root = Path(tmp)
        make_model(root / "r0", size)
        rows = []
        for via in ("sendrecv", "allsum"):
            runs = [spread_once(root, via, chunk) for _ in range(args.runs)]
            rows.append((f"spread, 2 local ranks, ring, {via}", cell(size, [s for s, _ in runs]),
                         cell(size, [w for _, w in runs])))
        copies = [copy_once(root) for _ in range(args.runs)]
        rows.append(("shutil.copyfile, same disk", cell(size, copies), cell(size, copies)))
    print(f"\nspreading {args.size_mb} MiB ({size} bytes), chunks of {args.chunk_mb} MiB, {args.runs} runs, "
          f"{os.cpu_count()} cores; MB/s as best (median)\n")
    print("| how | stream MB/s | end to end MB/s |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
