"""Step plans: what rank 0 decided for one step, and how a plan travels in fixed-size buffers.

Rank 0 contributes the encoded plan, every other rank zeros, so the sum is the plan on every
rank. The buffer has a fixed size (identical shapes on all ranks are what keep the collective
in step); a plan larger than one buffer goes in several, the first carrying the total length so
followers know how many more to join. The collective itself is passed in (`AllSum`), so this
module needs no MLX and its chunking is tested without it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Iterator

import msgspec

_LEN = struct.Struct(">I")

# Sums one buffer of the channel's size over all ranks and returns the sum's bytes.
AllSum = Callable[[bytes], bytes]


# Compiled grammars every rank keeps, by text (engine/decoding/constrained.py). Compiling happens inside
# the step on every rank, so rank 0 plans at most one grammar outside this cache per step.
GRAMMAR_CACHE_SIZE = 32


class ImageRows(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One image's rows of input embeddings (the vision tower's projected features), for the tokens first ..
    first + rows - 1 of a prompt (engine/vision): every rank's embedding layer reads them there."""

    first: int
    rows: int
    dtype: str  # numpy's name: float32, float16, bfloat16 travels as its uint16 bits
    data: bytes
    # (rows, columns) of image tokens, for a family whose image tokens take 2-D positions (engine/vision/mrope.py)
    grid: list[int] = []


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
    # an llguidance grammar every rank compiles into the same token mask (engine/decoding/constrained.py)
    grammar: str = ""
    # prefix cache: start from the first cache_len tokens of entry cache_id (0: none), computing only the rest
    cache_id: int = 0
    cache_len: int = 0
    # keep this sequence's KV when it ends, until a plan stores it (Plan.stores) or lets it go
    keep: bool = False
    # keep its state just before the prompt's last token likewise: the boundary a next turn extends (and the same
    # prompt again starts from), for a model whose entries cannot be cut (engine/lockstep/cuts.py)
    keep_prompt: bool = False
    # ...and its state after its first keep_at tokens (0: none): where its prompt parts from other prompts
    keep_at: int = 0
    # its prompt's logprobs, with this many alternatives per token (-1: not asked): every rank computes them in
    # the prefill passes, rank 0 reports them (completions with echo and logprobs)
    prompt_logprobs: int = -1
    # the features of the images among its tokens (engine/vision): every rank holds them while it runs
    images: list[ImageRows] = []


class Store(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Keep the KV of the first `length` tokens of a sequence as entry `entry`: one that ended (or is removed by
    this plan, mid-prefill too: `least`), or one running, from its prompt's end when that is what `length` covers."""

    rid: str
    entry: int
    length: int
    # not 0: a sequence removed while its prompt was being prefilled; keep every token it has fed, up to `length`,
    # where that is at least `least` (every rank fed the same: rank 0 reads the length kept once it has applied it)
    least: int = 0
    # not empty: every rank also writes the entry to its disk tier under this name (engine/lockstep/disk.py)
    disk: str = ""
    # disk entries this one supersedes: deleted only once it is written, so a write skipped (the writer behind, a
    # full disk) leaves the turn before on disk
    replaces: list[str] = []

    def keeps(self, fed: int) -> int:
        """Tokens to keep of a sequence that has fed `fed` (0: none)."""
        if not self.least:
            return self.length
        return min(fed, self.length) if fed >= self.least else 0


class Restore(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Load the disk tier's entry `name` (its first `length` tokens) as prefix cache entry `entry`, on every rank; where
    any rank lacks it or finds it damaged, no rank keeps it (engine/lockstep/disk.py)."""

    entry: int
    name: str
    length: int


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
    # Prefix cache operations, applied in this order: stores (before removes let the KV go), inserts
    # (which copy the entries they start from), then evicts.
    stores: list[Store] = []
    evicts: list[int] = []
    # After this (idle) plan every rank probes the links between ranks, this many bytes for bandwidth (0: none):
    # engine/lockstep/link_probe.py
    probe: int = 0
    # Speculative decoding: the tokens rank 0 proposes to follow each decoding request's next input (request id ->
    # draft tokens); every rank verifies them in this step's one forward pass and keeps the same ones
    # (engine/speculative). Absent requests decode one token as usual.
    drafts: dict[str, list[int]] = {}
    # How plan step + 1 travels: made after this step's forward pass (and broadcast then) instead of sent ahead of
    # it, so that rank 0 can propose drafts continuing the tokens this step samples. Every rank reads it here, in the
    # plan before, so the ranks' collectives stay in the same order.
    next_after: bool = False
    # SPECULATIVE=mtp: after this step every rank chains the heads for the next plan's drafts; False when rank 0
    # knows that plan drafts nothing (sent ahead, or every sequence within a token of max_tokens), so no rank pays
    # for heads' passes nobody reads. In the plan, not decided per rank: the sharded heads' all_sums must meet.
    chain: bool = False
    # The disk tier (engine/lockstep/disk.py): entries loaded from disk before the inserts that start from them (one
    # extra collective agrees which every rank has), and disk copies to delete (their RAM entry was superseded).
    restores: list[Restore] = []
    disk_deletes: list[str] = []


class PlanError(RuntimeError):
    """A plan that does not decode: the ranks' collectives are out of step."""


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Plan)


def fingerprint(step: int, rids: list[str], entries: list[int] = ()) -> int:
    """A cheap digest of which requests are in the batch, in order, and which prefix cache entries every
    rank holds, at a step."""
    text = "\x00".join(rids) + "\x01" + ",".join(map(str, sorted(entries)))
    return zlib.crc32(text.encode(), step & 0xFFFFFFFF)


def token_checksum(tokens: list[int]) -> int:
    """Digest of one step's sampled tokens (order matters)."""
    return zlib.crc32(struct.pack(f">{len(tokens)}I", *tokens)) if tokens else 0


def chunks(plan: Plan, buffer_bytes: int) -> Iterator[bytes]:
    """The plan as zero-padded buffers of buffer_bytes: its length, then its msgpack encoding."""
    payload = _encoder.encode(plan)
    data = _LEN.pack(len(payload)) + payload
    for offset in range(0, len(data), buffer_bytes):
        yield data[offset : offset + buffer_bytes].ljust(buffer_bytes, b"\0")


def send(plan: Plan, all_sum: AllSum, buffer_bytes: int, skip_first: bool = False) -> None:
    """Rank 0: contribute the plan, one all_sum per buffer (skip_first: the first one was summed already,
    ahead of time)."""
    for i, buf in enumerate(chunks(plan, buffer_bytes)):
        if i or not skip_first:
            all_sum(buf)


def receive(all_sum: AllSum, buffer_bytes: int, rank: int, first: bytes | None = None) -> Plan:
    """Every other rank: contribute zeros until the whole plan has arrived (first: the sum of the first
    buffer, when it was summed ahead of time); raises PlanError."""
    zeros = bytes(buffer_bytes)
    if first is None:
        first = all_sum(zeros)
    (length,) = _LEN.unpack_from(first)
    data = bytearray(first)
    while len(data) < length + _LEN.size:
        data += all_sum(zeros)
    try:
        return _decoder.decode(bytes(data[_LEN.size : _LEN.size + length]))
    except msgspec.DecodeError as exc:
        raise PlanError(f"rank {rank}: received an undecodable plan ({exc}); the ranks are out of step") from None
