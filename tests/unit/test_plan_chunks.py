"""Plans through fixed-size buffers over a fake all_sum: every rank runs the same collectives and
followers rebuild exactly the plan rank 0 sent."""

from __future__ import annotations

import struct

import msgspec
import pytest

from engine.lockstep import plan as plans
from engine.lockstep.plan import Insert, Plan, PlanError


class Collective:
    """A fake all_sum between rank 0 and its followers: rank 0's buffers are recorded, and each
    follower's n-th call returns the byte-wise sum of its zeros and rank 0's n-th buffer."""

    def __init__(self, buffer_bytes: int):
        self.buffer_bytes = buffer_bytes
        self.sent: list[bytes] = []

    def lead(self, buf: bytes) -> bytes:
        assert len(buf) == self.buffer_bytes  # identical shapes on every rank keep the collective in step
        self.sent.append(buf)
        return buf

    def follower(self) -> tuple[list[bytes], plans.AllSum]:
        calls: list[bytes] = []

        def all_sum(buf: bytes) -> bytes:
            assert len(buf) == self.buffer_bytes and not any(buf)  # followers contribute zeros
            lead = self.sent[len(calls)]
            calls.append(buf)
            return bytes(a + b for a, b in zip(lead, buf))

        return calls, all_sum


def plan_with(tokens: int, step: int = 7) -> Plan:
    inserts = [Insert(rid="chatcmpl-1", tokens=list(range(tokens)), max_tokens=16, temperature=0.7, seed=42,
                      logit_bias={5: -1.5}, grammar="start: \"x\"")]
    return Plan(step=step, fingerprint=0xDEADBEEF, token_check=123, inserts=inserts, removes=["gone"],
                prefill_chunk=64)


def round_trip(plan: Plan, buffer_bytes: int, followers: int = 2) -> tuple[Collective, list[Plan]]:
    wire = Collective(buffer_bytes)
    plans.send(plan, wire.lead, buffer_bytes)
    received = []
    for rank in range(1, followers + 1):
        calls, all_sum = wire.follower()
        received.append(plans.receive(all_sum, buffer_bytes, rank))
        assert len(calls) == len(wire.sent)  # a follower joins exactly as many collectives as rank 0 ran
    return wire, received


def test_a_small_plan_takes_one_buffer() -> None:
    plan = Plan(step=0, fingerprint=1, token_check=0, idle=True)
    wire, received = round_trip(plan, 256)
    assert len(wire.sent) == 1
    assert received == [plan, plan]


def test_a_plan_larger_than_a_buffer_goes_in_several_and_followers_reassemble_it() -> None:
    plan = plan_with(tokens=500)
    encoded = msgspec.msgpack.encode(plan)
    assert len(encoded) > 3 * 256
    wire, received = round_trip(plan, 256, followers=3)
    assert len(wire.sent) == -(-(len(encoded) + 4) // 256)
    assert received == [plan] * 3


def test_the_buffers_carry_the_length_then_the_encoding_zero_padded() -> None:
    plan = plan_with(tokens=100)
    payload = msgspec.msgpack.encode(plan)
    buffers = list(plans.chunks(plan, 64))
    assert all(len(b) == 64 for b in buffers)
    data = b"".join(buffers)
    assert struct.unpack(">I", data[:4]) == (len(payload),)
    assert data[4 : 4 + len(payload)] == payload
    assert not any(data[4 + len(payload) :])


@pytest.mark.parametrize("buffer_bytes", [256, 257, 300])
def test_every_plan_size_around_the_buffer_boundaries_round_trips(buffer_bytes: int) -> None:
    for tokens in range(0, 400, 3):
        plan = plan_with(tokens)
        _, received = round_trip(plan, buffer_bytes, followers=1)
        assert received == [plan]


def test_an_undecodable_plan_raises_plan_error_naming_the_rank() -> None:
    junk = struct.pack(">I", 9) + b"\xc1" * 9  # 0xc1 is never valid msgpack
    wire = Collective(256)
    wire.lead(junk.ljust(256, b"\0"))
    _, all_sum = wire.follower()
    with pytest.raises(PlanError, match="rank 2: received an undecodable plan"):
        plans.receive(all_sum, 256, rank=2)


def test_a_plan_of_another_shape_is_a_plan_error_too() -> None:
    payload = msgspec.msgpack.encode({"step": "not a plan"})
    wire = Collective(256)
    wire.lead((struct.pack(">I", len(payload)) + payload).ljust(256, b"\0"))
    _, all_sum = wire.follower()
    with pytest.raises(PlanError):
        plans.receive(all_sum, 256, rank=1)


def test_fingerprint_and_token_checksum_follow_order() -> None:
    assert plans.fingerprint(3, ["a", "b"]) != plans.fingerprint(3, ["b", "a"])
    assert plans.fingerprint(3, ["a", "b"]) != plans.fingerprint(4, ["a", "b"])
    assert plans.token_checksum([1, 2]) != plans.token_checksum([2, 1])
    assert plans.token_checksum([]) == 0


@pytest.mark.parametrize("tokens", [0, 500])
def test_a_plan_sent_ahead_arrives_whole_when_its_first_buffer_was_summed_earlier(tokens: int) -> None:
    """The loop sums a plan's first buffer before the step's forward pass and the rest (if any) after it."""
    plan = plan_with(tokens=tokens)
    wire = Collective(256)
    first = next(plans.chunks(plan, 256))
    wire.lead(first)  # summed ahead, before the forward pass
    plans.send(plan, wire.lead, 256, skip_first=True)  # the rest, once the pass is queued
    assert wire.sent == list(plans.chunks(plan, 256))
    calls, all_sum = wire.follower()
    ahead = all_sum(bytes(256))
    assert plans.receive(all_sum, 256, rank=1, first=ahead) == plan
    assert len(calls) == len(wire.sent)
