"""Where the plan channel's and the link probe's collectives run, recorded by a spy on every mx.distributed call.

Given mlx-lm's generation stream (a CPU stream here; the GPU on a Mac, which Metal cannot run a collective on),
each collective must take the very stream a tensor-parallel layer of mlx-lm's own takes when mlx-lm runs it
under that stream: never a GPU stream, and one stream with the model's all_sums so that every rank meets them
in the same order. Without a GPU here, the Mac's stream is a stand-in on the GPU device; entering it changes
only the GPU's default stream, as MLX does (on a machine with a GPU the test uses a real one instead).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import mlx.core as mx
import pytest
from mlx.nn.layers.distributed import ShardedToAllLinear
from mlx_lm.generate import generation_stream

from engine.lockstep.channel import PlanChannel
from engine.lockstep.link_probe import probe
from engine.lockstep.plan import Plan

PAIRS = [(0, 1)]


@dataclass
class Group:
    """A two-rank group as this rank sees it; the spy answers for the peer."""

    me: int
    n: int = 2

    def rank(self) -> int:
        return self.me

    def size(self) -> int:
        return self.n


@dataclass(frozen=True)
class StandInGpuStream:
    """mlx-lm's generation stream on a Mac (mx.new_thread_local_stream(mx.gpu)), where no GPU exists."""

    device: mx.Device = mx.Device(mx.gpu)


class Spy:
    """Records the stream each collective would run on: the one passed, else the CPU's default (ring, JACCL)."""

    def __init__(self, monkeypatch) -> None:
        self.streams: list[tuple[str, object]] = []
        for name, answer in (("all_sum", lambda x, *a: x), ("send", lambda x, *a: x),
                             ("recv_like", lambda x, *a: mx.ones_like(x))):  # 1: the peer's last ping
            monkeypatch.setattr(mx.distributed, name, self.wrap(name, answer))

    def wrap(self, name, answer):
        def collective(x, *args, group=None, stream=None):
            self.streams.append((name, resolve(stream)))
            return answer(x, *args)
        return collective

    def off_the_cpu(self) -> list:
        return [(name, s) for name, s in self.streams if getattr(s, "device", s) != mx.cpu]


def resolve(stream):
    """The stream MLX runs a ring or JACCL collective on, given what the call passed."""
    if stream is None:
        return mx.default_stream(mx.cpu)
    if isinstance(stream, (mx.Device, mx.DeviceType)) and stream == mx.cpu:
        return mx.default_stream(stream)
    if isinstance(stream, mx.ThreadLocalStream) and stream.device == mx.cpu:
        with mx.stream(stream):  # this thread's own stream of it
            return mx.default_stream(mx.cpu)
    return stream


def model_stream(kind: str, monkeypatch):
    if kind == "generation_stream":
        return generation_stream  # what the engine hands the channel: mlx-lm's own (the CPU's here, a GPU's on a Mac)
    if mx.is_available(mx.gpu):
        return mx.new_thread_local_stream(mx.gpu)
    real = mx.stream

    @contextmanager
    def stream(s):  # a GPU stream sets the GPU's default stream only, so the CPU's stays as it was
        if isinstance(s, StandInGpuStream):
            yield
        else:
            with real(s):
                yield
    monkeypatch.setattr(mx, "stream", stream)
    return StandInGpuStream()


def where_the_model_meets(spy: Spy, model, group) -> object:
    """The stream of the all_sum in mlx-lm's row-sharded linear layer, run under the model's stream as mlx-lm does."""
    layer = ShardedToAllLinear(8, 4, group=group)
    with mx.stream(model):
        mx.eval(layer(mx.ones((1, 4))))
    (name, lands), = spy.streams
    spy.streams.clear()
    return lands


@pytest.mark.parametrize("kind", ["generation_stream", "gpu_stream"])
def test_plans_and_link_probes_meet_on_the_cpu_stream_the_models_own_all_sums_take(kind, monkeypatch) -> None:
    model = model_stream(kind, monkeypatch)
    spy = Spy(monkeypatch)
    for rank in (0, 1):
        group = Group(rank)
        lands = where_the_model_meets(spy, model, group)
        channel = PlanChannel(group, 64, model)
        if rank == 0:  # rank 0 sends plans: the spy's all_sum hands its own bytes back, as the others add zeros
            plan = Plan(step=1, fingerprint=2, token_check=3)
            assert channel.broadcast(plan) == plan
            assert channel.collect(channel.post(plan)) == plan
        assert channel.gather([rank + 1])[rank] == [rank + 1]
        probe(PAIRS, 1024, rank, group, model)  # rank 0 measures, rank 1 echoes
        kinds = {name for name, _ in spy.streams}
        assert kinds == {"all_sum", "send", "recv_like"}, kinds
        assert not spy.off_the_cpu(), f"rank {rank}: collectives handed a GPU stream: {spy.off_the_cpu()}"
        assert all(s == lands for _, s in spy.streams), f"not all on the model's all_sums' {lands}: {spy.streams}"
        spy.streams.clear()


def test_without_a_model_stream_collectives_take_the_cpus_default(monkeypatch) -> None:
    spy = Spy(monkeypatch)
    channel = PlanChannel(Group(1), 64)
    channel.gather([1])
    assert spy.streams == [("all_sum", mx.default_stream(mx.cpu))]


def test_every_rank_meets_after_each_pair_of_a_probe_its_own_or_not(monkeypatch) -> None:
    """A one-byte, a large and a one-byte send/recv between two ranks, the next pair's close behind, is a pattern
    MLX has answered with wrong data or a hang: the probe puts an all_sum on every rank between pairs."""
    spy = Spy(monkeypatch)
    pairs = [(0, 1), (1, 2), (0, 2)]  # JACCL's: every pair of three ranks
    probe(pairs, 1024, 2, Group(2, 3), generation_stream)
    names = [name for name, _ in spy.streams]
    # rank 2 sits out (0, 1), echoes 1's pings then takes its large send, echoes 0's likewise
    pair_12 = names[1:names.index("all_sum", 1)]
    assert names[0] == "all_sum" and names[-1] == "all_sum" and names.count("all_sum") == 3, names
    assert set(pair_12) == {"send", "recv_like"} and pair_12[-1] == "send", names
