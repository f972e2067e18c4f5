"""Step plans: what rank 0 decided for one step, and their broadcast through a padded all_sum.

Rank 0 contributes the encoded plan, every other rank zeros, so the sum is the plan on
every rank. The buffer has a fixed size (identical shapes on all ranks are what keep the
collective in step); a plan larger than one buffer goes in several, the first carrying the
total length so followers know how many more to join.
"""

from __future__ import annotations

import struct
import zlib

import mlx.core as mx
import msgspec
import numpy as np

_LEN = struct.Struct(">I")


class Insert(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """A request joining the batch: everything a rank needs to decode it identically."""

    rid: str
    tokens: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    logit_bias: dict[int, float] = {}
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # rank 0 keeps the sampled token's logprob row for requests that asked (the others ignore it)
    logprobs: bool = False
    # an llguidance grammar every rank compiles into the same token mask (engine/constrained.py)
    grammar: str = ""


class Plan(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One step's decisions; every rank applies exactly this and nothing else."""

    step: int
    # Fingerprint of the batch composition before this plan applies, and a checksum of
    # the tokens every rank sampled in the previous work step: followers compare both.
    fingerprint: int
    token_check: int
    inserts: list[Insert] = []
    removes: list[str] = []
    idle: bool = False
    shutdown: bool = False
    # Prompt tokens per sequence for this step's prefill chunk (0: unchanged).
    prefill_chunk: int = 0
    # Every rank reports its state after applying this plan (rank 0 asks about once a second).
    report: bool = False


class PlanError(RuntimeError):
    """A plan that does not decode: the ranks' collectives are out of step."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Plan)


def fingerprint(step: int, rids: list[str]) -> int:
    """A cheap digest of which requests are in the batch, in order, at a step."""
    return zlib.crc32("\x00".join(rids).encode(), step & 0xFFFFFFFF)


def token_checksum(tokens: list[int]) -> int:
    """Digest of one step's sampled tokens (order matters)."""
    return zlib.crc32(struct.pack(f">{len(tokens)}I", *tokens)) if tokens else 0


class PlanChannel:
    """Broadcasts plans from rank 0 to all ranks with fixed-size all_sum buffers."""

    def __init__(self, group: mx.distributed.Group | None, buffer_bytes: int, stream=None):
        # The plan must travel on the model's stream: mlx-lm evaluates the next forward step
        # asynchronously, and a collective on another stream could interleave with the
        # model's own all_sums in a different order on each rank.
        self.stream = stream
        self.group = group
        self.size = group.size() if group is not None else 1
        self.rank = group.rank() if group is not None else 0
        self.buffer_bytes = buffer_bytes
        self._zeros = mx.zeros((buffer_bytes,), dtype=mx.uint8)
        self.collectives = 0

    def _all_sum(self, chunk: mx.array) -> bytes:
        out = mx.distributed.all_sum(chunk, group=self.group, stream=self.stream)
        mx.eval(out)
        self.collectives += 1
        return np.asarray(out).tobytes()

    def gather(self, row: list[int]) -> list[list[int]]:
        """Every rank contributes one row of int32s; every rank gets all rows (all_sum of disjoint rows)."""
        if self.size == 1:
            return [list(row)]
        table = np.zeros((self.size, len(row)), dtype=np.int32)
        table[self.rank] = row
        out = mx.distributed.all_sum(mx.array(table), group=self.group, stream=self.stream)
        mx.eval(out)
        self.collectives += 1
        return np.asarray(out).tolist()

    def broadcast(self, plan: Plan | None) -> Plan:
        """Rank 0 passes its plan, the others None; every rank returns the same Plan."""
        if self.size == 1:
            assert plan is not None
            return plan
        if self.rank == 0:
            assert plan is not None
            payload = _encoder.encode(plan)
            data = _LEN.pack(len(payload)) + payload
            for offset in range(0, len(data), self.buffer_bytes):
                buf = np.zeros(self.buffer_bytes, dtype=np.uint8)
                piece = np.frombuffer(data[offset : offset + self.buffer_bytes], dtype=np.uint8)
                buf[: piece.size] = piece
                self._all_sum(mx.array(buf))
            return plan
        first = self._all_sum(self._zeros)
        (length,) = _LEN.unpack_from(first)
        data = bytearray(first)
        while len(data) < length + _LEN.size:
            data += self._all_sum(self._zeros)
        try:
            return _decoder.decode(bytes(data[_LEN.size : _LEN.size + length]))
        except msgspec.DecodeError as exc:
            raise PlanError(f"rank {self.rank}: received an undecodable plan ({exc}); the ranks are out of step") from None
