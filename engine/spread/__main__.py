"""`python -m engine.spread`: one rank of a spread, started on every rank by mlx.launch (ops/spread.py).

1. rank 0 broadcasts the manifest; 2. every rank checks its own cache (size, then sha256 of what has the
right size) and reports, with its free disk bytes, what it needs; 3. every rank decides alike from that
table: refuse (rank 0 lacks a file, a rank lacks room) before any byte moves, or stream the blobs some
rank needs; 4. receivers check each blob's sha256 before it takes its name, and write the manifest
last; 5. rank 0 writes the result for ops. Every wait is bounded (engine/spread/watch.py).
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import socket
import sys
from pathlib import Path

from config.hub_cache import Manifest, write_manifest
from config.hub_store import COMPLETE, RankStore, free_bytes, items
from ipc.lifecycle import ExitCause
from ipc.spread import JOINED, RESULT, SpreadResult, test_hook
from ops.progress import Progress

from engine.spread.hooks import ChunkHooks
from engine.spread.plan import Plan
from engine.spread.watch import Deadline, start

HASH_FLOOR = 50e6  # bytes/s any host hashes at least: the check phase's deadline grows with the model
JOIN_SECONDS = 120.0  # for every rank to start and meet (ssh, python start-up, the ring's connections)


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m engine.spread")
    p.add_argument("--manifest", required=True, help="rank 0: the manifest of the model to spread")
    p.add_argument("--result", required=True, help="rank 0: where to write the result (JSON)")
    p.add_argument("--chunk-bytes", type=int, default=64 << 20)
    p.add_argument("--via", choices=("auto", "sendrecv", "allsum"), default="auto")
    p.add_argument("--hosts", default="", help="the hosts by rank, comma-separated, for messages")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    started = start("spread", JOIN_SECONDS)
    if isinstance(started, int):
        return started
    settings, deadline = started
    import mlx.core as mx  # after the deadline runs: a rank that cannot even import ends in time

    from engine.spread.wire import Wire

    mx.set_default_device(mx.cpu)
    # the backend the engine runs (JACCL's RDMA on Macs), never "any": MLX would pick whatever it finds first
    wire = Wire(mx.distributed.init(strict=True, backend=settings.BACKEND))
    rank = deadline.rank = wire.rank
    try:
        spread(wire, settings, args, deadline)
    except RuntimeError as exc:
        # mlx raises RuntimeError when a collective loses its peer: the culprit is that peer, not us
        print(f"spread rank {rank}: {exc}; a peer rank is gone, ending this rank", file=sys.stderr, flush=True)
        os._exit(ExitCause.PEER_LOST)
    except Exception as exc:  # one line naming the rank; mlx.launch then ends the others
        print(f"spread rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(ExitCause.FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip MLX's teardown of the group: the work is done and recorded


def spread(wire, settings, args, deadline: Deadline) -> None:
    rank, stall = wire.rank, settings.WATCHDOG_TIMEOUT
    deadline.beat("receiving the manifest", stall)
    text = Path(args.manifest).read_bytes() if rank == 0 else None
    manifest = Manifest.from_json(wire.broadcast(text))
    if rank == 0:
        print(JOINED, file=sys.stderr, flush=True)
    store = RankStore(settings.hub_cache(rank), manifest)
    blobs = items(manifest)
    keys = [k for k, *_ in wire.gather([_place_key(store.cache)])]
    writer = rank > 0 and keys.index(keys[rank]) == rank  # one writer per folder; rank 0's is the source
    deadline.beat("checking every rank's cache", stall + manifest.total_bytes / HASH_FLOOR)
    plan = Plan(wire.gather(_survey(rank, writer, store, blobs)), blobs)
    hosts = [h for h in args.hosts.split(",") if h]
    refusal = plan.refusal(manifest, hosts, [settings.hub_cache(r) for r in range(wire.size)])
    if refusal is not None:  # the dashboard shows it too
        progress = Progress(settings.run_dir, manifest.repo, "spread", 0, stream=io.StringIO()) if rank == 0 else None
        _finish(rank, args, SpreadResult(ok=False, message=refusal), progress)
        return
    from engine.spread.stream import Streamer  # MLX: only once there is something to move

    streamer = Streamer(wire, args, store, plan, deadline, stall, ChunkHooks(rank))
    progress = streamer.progress(settings.run_dir, manifest, hosts) if rank == 0 else None
    bad = streamer.run(progress)
    if writer and not bad:
        write_manifest(store.cache, manifest)  # last: its presence says this rank holds the whole model
    deadline.beat("gathering every rank's verdict", stall)
    verdicts = wire.gather([len(bad), bad[0] if bad else -1])
    if rank == 0:
        _finish(rank, args, streamer.result(verdicts, manifest, hosts), progress)


def _place_key(cache: Path) -> int:
    """The same number on ranks that share a cache folder on one host."""
    digest = hashlib.sha256(f"{socket.gethostname()}\0{os.path.realpath(cache)}".encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


def _survey(rank: int, writer: bool, store: RankStore, blobs) -> list[int]:
    """This rank's row: [free bytes, bytes it needs, files rank 0 lacks, have of each blob...]."""
    if rank == 0:
        lacking = sum(not store.sizes_only(b) for b in blobs)
        return [0, 0, lacking, *([COMPLETE] * len(blobs))]
    if not writer:
        return [0, 0, 0, *([COMPLETE] * len(blobs))]
    haves = [store.have(b) for b in blobs]
    need = sum(b.size - max(h, 0) for b, h in zip(blobs, haves) if h != COMPLETE)
    free = test_hook("MCS_SPREAD_TEST_FREE_BYTES", rank)
    return [free_bytes(store.cache) if free is None else free, need, 0, *haves]


def _finish(rank: int, args, result: SpreadResult, progress) -> None:
    if rank != 0:
        return
    if progress is not None:
        progress.done(result.message) if result.ok else progress.failed(result.message)
    RESULT.write(Path(args.result), result)


if __name__ == "__main__":
    sys.exit(main())
