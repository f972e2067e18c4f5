"""`python -m engine.link_check`: one rank of `./launch.sh check --links`, started by mlx.launch (ops/link_check.py).

No model: each rank joins the BACKEND group and builds the plan channel on mlx-lm's generation stream exactly as
the engine does (engine/__main__.py; the GPU on a Mac, where a collective handed it dies), then runs what an
engine's start and an idle engine run over it: a gather (the hosts), a plan broadcast, a plan sent ahead, and a
probe of every pair the engine probes (engine/lockstep/link_probe.py), whose figures rank 0 gathers and writes
for ops. Every wait is bounded (engine/spread/watch.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ipc.lifecycle import ExitCause
from ipc.link_check import JOINED, RESULT, TEST_EXIT, LinkCheckResult
from ipc.spread import test_hook

from engine.spread.watch import Deadline, start

JOIN_SECONDS = 120.0  # for every rank to start and meet (ssh, python start-up, the ring's connections)
STEP_SECONDS = 60.0  # for each exchange after that
PROBE_BYTES = 4 << 20  # the engine's largest probe


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.link_check")
    p.add_argument("--result", required=True, help="rank 0: where to write the result (JSON)")
    p.add_argument("--bytes", type=int, default=PROBE_BYTES, help="the bandwidth probe's size")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    started = start("links", JOIN_SECONDS)
    if isinstance(started, int):
        return started
    settings, deadline = started
    try:
        result = check(settings, args.bytes, deadline)
        if result is not None:
            RESULT.write(Path(args.result), result)
    except Exception as exc:  # one line naming the rank (MLX raises RuntimeError: a stream it cannot run a
        # collective on, a lost peer); mlx.launch then ends the others
        print(f"links rank {deadline.rank}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        os._exit(ExitCause.PEER_LOST if "peer" in str(exc).lower() else ExitCause.FAILED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip MLX's teardown of the group: the work is done and recorded


def check(settings, nbytes: int, deadline: Deadline) -> LinkCheckResult | None:
    """Every rank: the exchanges; rank 0 returns the figures, the others None."""
    import mlx.core as mx
    from mlx_lm.generate import generation_stream  # what BatchGenerator runs the model on, as in the engine

    from engine.lockstep.channel import PlanChannel
    from engine.lockstep.link_probe import probe
    from engine.lockstep.plan import Plan
    from engine.rank0.links import LinkProbes
    from engine.ranks import decode_hostnames, hostname_row

    group = mx.distributed.init(strict=True, backend=settings.BACKEND)
    rank = deadline.rank = group.rank()
    channel = PlanChannel(group, settings.PLAN_BUFFER_BYTES, generation_stream)
    hosts = decode_hostnames(channel.gather(hostname_row()))
    if rank == 0:
        print(JOINED, file=sys.stderr, flush=True)
    if (code := test_hook(TEST_EXIT, rank)) is not None:  # a rank that fails once joined, for the tests
        print(f"links rank {rank}: test hook: exiting with {code}", file=sys.stderr, flush=True)
        os._exit(code)
    deadline.beat("broadcasting a plan", STEP_SECONDS)
    plan = channel.broadcast(Plan(step=1, fingerprint=0, token_check=0, probe=nbytes) if rank == 0 else None)
    deadline.beat("sending a plan ahead", STEP_SECONDS)
    ahead = channel.collect(channel.post(Plan(step=2, fingerprint=0, token_check=0) if rank == 0 else None))
    if (plan.step, plan.probe, ahead.step) != (1, nbytes, 2):
        raise RuntimeError(f"the plans arrived wrong (steps {plan.step}, {ahead.step}): the ranks are out of step")
    links = LinkProbes(group.size(), settings.BACKEND, hosts)
    deadline.beat(f"probing {len(links.pairs)} link(s)", STEP_SECONDS)
    rows = channel.gather(probe(links.pairs, plan.probe, rank, group, channel.stream))
    if rank != 0:
        return None
    links.record(rows, plan.probe)
    return LinkCheckResult(ranks=group.size(), backend=settings.BACKEND, hosts=hosts, links=links.snapshot())


if __name__ == "__main__":
    sys.exit(main())
