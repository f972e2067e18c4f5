"""Spread a downloaded model from rank 0's cache to every other rank's.

`spread(settings, manifest, hosts)` makes every rank's cache (Settings.hub_cache(rank)) hold the manifest's
files, checked by size and sha256, with the manifest written last. Ranks whose cache is rank 0's own (same
host, same folder) need nothing.

SPREAD_TRANSPORT=cluster starts `python -m engine.spread` on every rank through mlx.launch on the
configured hosts and BACKEND, beside a serving engine (ops/rank_job.py), except with JACCL: a serving
engine holds the RDMA devices then, and the spread says to stop it or to use rsync.
SPREAD_TRANSPORT=rsync: ops/spread_rsync.py.

`python -m ops.spread REPO [--revision R]` spreads a model rank 0's cache holds whole (its manifest).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path

import msgspec

from config import ConfigError, Settings, load_settings
from config.hub_cache import Manifest, read_manifest
from ipc.spread import JOINED, PARENT_ENV, decode_result
from ops.rank_job import LOCAL, JobFailed, RankJob, engine_holds_rdma

CHUNK_BYTES = 64 << 20  # per transfer: large enough for the link's full rate, small enough to resume often
RESULT_FILE = "spread-result.json"


def targets(settings: Settings, hosts: list[str]) -> list[int]:
    """Ranks (in rank order, rank 0 excluded) whose host or cache folder differs from rank 0's."""
    out = []
    for rank in range(1, len(hosts)):
        same_host = hosts[rank] == hosts[0] or {hosts[rank], hosts[0]} <= LOCAL
        if not same_host or settings.hub_cache(rank) != settings.hub_cache(0):
            out.append(rank)
    return out


def spread(settings: Settings, manifest: Manifest, hosts: list[str], *, chunk_bytes: int = CHUNK_BYTES,
           via: str = "auto") -> int:
    """0 when every rank holds the model whole; else 1 after saying why."""
    ranks = targets(settings, hosts)
    if not ranks:
        return 0
    if settings.SPREAD_TRANSPORT == "rsync":
        from ops.spread_rsync import rsync_spread

        return rsync_spread(settings, manifest, hosts, ranks)
    if engine_holds_rdma(settings):
        return _fail("the serving engine holds the Thunderbolt RDMA devices that a JACCL spread needs: stop it first "
                     "(./launch.sh stop), or set SPREAD_TRANSPORT=rsync to copy over ssh while it serves")
    return ClusterSpread(settings, manifest, hosts, chunk_bytes, via).run()


class ClusterSpread:
    def __init__(self, settings: Settings, manifest: Manifest, hosts: list[str], chunk_bytes: int, via: str):
        self.settings, self.manifest, self.hosts = settings, manifest, hosts
        self.chunk_bytes, self.via = chunk_bytes, via
        self.folder = settings.run_dir

    def run(self) -> int:
        self.folder.mkdir(parents=True, exist_ok=True)
        manifest_path = self.folder / f"spread-manifest-{self.manifest.commit}.json"
        manifest_path.write_text(self.manifest.to_json())
        job = self.job(manifest_path)
        try:
            data = job.run()
        except JobFailed as exc:
            return _fail(str(exc))
        finally:
            manifest_path.unlink(missing_ok=True)
        try:
            result = decode_result(data)
        except msgspec.MsgspecError:
            return _fail(job.why_no_result())
        if not result.ok:
            return _fail(result.message)
        print(f"spread: bytes_sent={result.bytes_sent} files_sent={result.files_sent}")
        return 0

    def job(self, manifest_path: Path) -> RankJob:
        """The spreading ranks, every one started by mlx.launch."""
        return RankJob(self.settings, self.hosts, "spread", "engine.spread",
                       ["--manifest", str(manifest_path), "--chunk-bytes", str(self.chunk_bytes), "--via", self.via,
                        "--hosts", ",".join(self.hosts)],
                       self.folder / RESULT_FILE, JOINED, env={PARENT_ENV: f"{socket.gethostname()} {os.getpid()}"})


def _fail(message: str) -> int:
    print(f"spread: {message}", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.spread", description="Spread a model rank 0's cache holds "
                                "whole to every rank's cache.")
    p.add_argument("repo")
    p.add_argument("--revision", default="main")
    p.add_argument("--chunk-bytes", type=int, default=CHUNK_BYTES)
    p.add_argument("--via", choices=("auto", "sendrecv", "allsum"), default="auto",
                   help="cluster transport: all_sum (auto), or send/recv to each receiver")
    args = p.parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as exc:
        return _fail(f"configuration error: {exc}")
    if settings.HOSTFILE:
        from ops.cluster import cluster_hosts

        merged = cluster_hosts(settings)[0]
        hosts = [""] * sum(len(h.ranks) for h in merged)
        for h in merged:
            for r in h.ranks:
                hosts[r] = h.name
    else:
        hosts = settings.hosts
    manifest = read_manifest(settings.hub_cache(0), args.repo, args.revision)
    if manifest is None:
        return _fail(f"rank 0's cache {settings.hub_cache(0)} holds no whole copy of {args.repo} at {args.revision} "
                     "(no manifest): download it first")
    return spread(settings, manifest, hosts, chunk_bytes=args.chunk_bytes, via=args.via)


if __name__ == "__main__":
    sys.exit(main())
