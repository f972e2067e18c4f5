"""Per-step cost of the plan broadcast: `engine.lockstep.channel.PlanChannel.broadcast` of a decode plan.

Run on every rank under mlx.launch (bench/run.py does it). Rank 0 broadcasts a typical decode
step's plan (no inserts, no removes) through the real PlanChannel with PLAN_BUFFER_BYTES-sized
buffers, on a stream of its own as the engine does; the others receive it. Each rank times
every call; rank 0 prints the distribution of both ranks.

    mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- python -m bench.plan_cost --calls 2000
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "MLX_RANK" in os.environ:
    _fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_fd, 0)
    os.close(_fd)
    print(f"BENCH-DETACHED rank={os.environ['MLX_RANK']}", flush=True)

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--buffer-bytes", type=int, default=4096)
    args = parser.parse_args()

    import mlx.core as mx
    import numpy as np

    from engine.lockstep.channel import PlanChannel
    from engine.lockstep.plan import Plan, fingerprint, token_checksum

    group = mx.distributed.init(strict=True, backend="ring")
    rank = group.rank()
    channel = PlanChannel(group, args.buffer_bytes, mx.new_stream(mx.default_device()))
    rids = [f"chatcmpl-{i:032x}" for i in range(8)]
    times = []
    for i in range(args.warmup + args.calls):
        plan = Plan(step=i, fingerprint=fingerprint(i, rids), token_check=token_checksum(list(range(8))))
        t0 = time.perf_counter()
        got = channel.broadcast(plan if rank == 0 else None)
        dt = time.perf_counter() - t0
        if got.step != i:
            print(f"rank {rank}: received step {got.step}, expected {i}", file=sys.stderr)
            return 1
        if i >= args.warmup:
            times.append(dt)
    us = np.array(times) * 1e6
    mine = np.array([np.percentile(us, 50), np.percentile(us, 90), us.mean()], dtype=np.float32)
    # Gather both ranks' numbers on rank 0 with one more all_sum (rank r writes row r).
    table = mx.zeros((group.size(), 3), dtype=mx.float32)
    table[rank] = mx.array(mine)
    table = np.array(mx.distributed.all_sum(table, group=group))
    if rank == 0:
        print("BENCH-RESULT " + json.dumps({
            "calls": args.calls, "buffer_bytes": args.buffer_bytes, "ranks": group.size(),
            "plan_bytes": len(channel_payload(plan)),
            "per_rank": [{"rank": r, "p50_us": float(row[0]), "p90_us": float(row[1]), "mean_us": float(row[2])}
                         for r, row in enumerate(table)],
            "collectives_per_call": channel.collectives / (args.warmup + args.calls),
        }), flush=True)
    return 0


def channel_payload(plan) -> bytes:
    import msgspec

    return msgspec.msgpack.encode(plan)


if __name__ == "__main__":
    sys.exit(main())
