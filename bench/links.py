"""The link probe's figures and what it costs: `engine.lockstep.link_probe.probe`, as the engine runs it.

Run by hand (it starts two local ranks over the ring backend with mlx.launch) or under mlx.launch yourself:

    python -m bench.links [--rounds 10]
    mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- python -m bench.links --worker

Each round probes every pair the engine would (ring: neighbours) at several bandwidth-probe sizes, beside a
model stream made as mlx-lm makes its generation stream, and gathers the figures through the plan channel;
rank 0 prints per size the median latency and bandwidth the probe reports, and its cost: wall time on the
measuring rank and bytes sent (one way, plus the one-byte round trips).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "MLX_RANK" in os.environ:
    _fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_fd, 0)
    os.close(_fd)

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

SIZES = (64 << 10, 256 << 10, 1 << 20, 4 << 20)


def worker(rounds: int, backend: str) -> int:
    import mlx.core as mx

    from engine.lockstep.channel import PlanChannel
    from engine.lockstep.link_pairs import LATENCY_BUDGET, LATENCY_ROUNDS, ROW_PER_PAIR, link_pairs
    from engine.lockstep.link_probe import probe

    group = mx.distributed.init(strict=True, backend=backend)
    rank, size = group.rank(), group.size()
    stream = mx.new_thread_local_stream(mx.default_device())  # the GPU on a Mac: never a collective's stream
    channel = PlanChannel(group, 4096, stream)
    pairs = link_pairs(size, backend)
    if rank == 0:
        print(f"{size} ranks over {backend}, pairs {pairs}, {rounds} rounds per size "
              f"(up to {LATENCY_ROUNDS} one-byte round trips within {LATENCY_BUDGET * 1e3:.0f} ms + 1 warm-up, "
              "per pair and round)")
        print(f"{'probe bytes':>12} {'latency':>10} {'bandwidth':>12} {'cost':>9} {'cost p90':>9} {'bytes sent':>11}")
    for nbytes in SIZES:
        figures = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            row = probe(pairs, nbytes, rank, group, stream)
            wall = time.perf_counter() - t0
            rows = channel.gather(row)
            lat_ns, bw_kib, cost_us = rows[0][:ROW_PER_PAIR]
            figures.append((lat_ns / 1e9, bw_kib * 1024.0, cost_us / 1e6, wall))
        if rank == 0:
            lat = statistics.median(f[0] for f in figures)
            bw = statistics.median(f[1] for f in figures)
            costs = sorted(f[2] for f in figures)
            sent = nbytes + 2 * (LATENCY_ROUNDS + 1) + 1  # at most: the round trips may end early
            print(f"{nbytes:>12} {lat * 1e6:>8.0f}us {bw / 1e9:>8.2f}GB/s {statistics.median(costs) * 1e3:>7.2f}ms "
                  f"{costs[int(0.9 * (len(costs) - 1))] * 1e3:>7.2f}ms {sent:>11}", flush=True)
    return 0


def launch(rounds: int) -> int:
    python = sys.executable
    mlx_launch = str(Path(python).parent / "mlx.launch")
    cmd = [mlx_launch, "--hosts", "127.0.0.1,127.0.0.1", "--backend", "ring", "--", python, "-m", "bench.links",
           "--worker", "--rounds", str(rounds)]
    return subprocess.run(cmd, cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.DEVNULL).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", action="store_true", help="run as one rank (under mlx.launch)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--backend", default="ring")
    args = parser.parse_args()
    return worker(args.rounds, args.backend) if args.worker else launch(args.rounds)


if __name__ == "__main__":
    sys.exit(main())
