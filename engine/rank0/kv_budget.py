"""How much KV memory a sequence takes on each rank, and the budget rank 0 keeps every rank within.

No MLX here: every rank measures its own caches at load (engine/kv_measure.py) and hands over plain
numbers (KVMemory): bytes per token of the layers that keep every token (KV, MLA's latent), bytes
per token of the sliding-window layers and the window they keep, and bytes of constant state per
sequence (linear attention). Rank 0 admits a sequence into the batch only when the batch's KV and
the prefix cache stay within KV_MEMORY_BYTES (engine/rank0/scheduler.py), so a long prompt or a big
batch waits instead of running a host out of memory. Where the caches cannot be measured, one
token's K and V come from the model's config instead (token_bytes).

mlx-lm's batch keeps every sequence's KV in one left-padded tensor, so each row is as long as the
longest sequence: a batch of n sequences holds n times the largest of them (batch_bytes).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.rank0.kv_precision import row_bytes

# mlx-lm's KVCache and BatchKVCache grow in steps of this many tokens
KV_STEP = 256
DTYPE_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}
# a config that names no dtype: MLX models run in float16 or bfloat16
DEFAULT_DTYPE_BYTES = 2
# the most tokens room() answers for a model whose memory stops growing (only windows and constant state)
NO_GROWTH_TOKENS = 2**40
# KV_MEMORY_BYTES=-1: this share of what the smallest rank has left after loading its weights (the rest is
# for activations, the batch's temporary copies when it grows, and everything else the host runs)
DEFAULT_SHARE = 2


def _number(config: Mapping[str, Any], *keys: str) -> int:
    for key in keys:
        value = config.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def token_bytes(config: Mapping[str, Any], ranks: int, dtype: str = "", pipeline_layers: int = 0,
                bits: int | None = None, group_size: int = 64) -> int:
    """Bytes one token's K and V take on one rank: layers x 2 x KV heads on the rank x one head_dim row (dtype
    bytes each, or with bits set packed with its scales and biases: kv_precision.row_bytes); 0 when the config
    does not say (then no budget can be kept).

    Tensor parallelism gives each rank kv_heads / ranks heads (mlx-lm's shard() divides them); rounding up
    keeps the estimate an upper bound should they not divide evenly. Pipeline parallelism instead gives a
    rank whole layers with all their heads: pipeline_layers, the most layers any rank holds. Sliding-window
    and linear-attention layers hold less than this, so for such models the estimate errs on the safe side."""
    if pipeline_layers:
        return token_bytes({**config, "num_hidden_layers": pipeline_layers}, 1, dtype, bits=bits, group_size=group_size)
    layers = _number(config, "num_hidden_layers", "n_layer", "num_layers")
    heads = _number(config, "num_attention_heads", "n_head")
    kv_heads = _number(config, "num_key_value_heads", "num_kv_heads", "n_kv_heads") or heads
    head_dim = _number(config, "head_dim") or (_number(config, "hidden_size") // heads if heads else 0)
    if not (layers and kv_heads and head_dim):
        return 0
    per_rank = -(-kv_heads // max(1, ranks))
    size = DTYPE_BYTES.get(dtype.removeprefix("torch."), DEFAULT_DTYPE_BYTES)
    return layers * 2 * per_rank * row_bytes(head_dim, size, bits, group_size)


def steps(tokens: int) -> int:
    """tokens rounded up to the KV cache's growth step."""
    return -(-max(0, tokens) // KV_STEP) * KV_STEP


def batch_bytes(sequences: Iterable[int]) -> int:
    """What a batch of sequences of these sizes holds: every row padded to the largest."""
    sizes = list(sequences)
    return len(sizes) * max(sizes) if sizes else 0


def memory_left(ranks: Sequence[Any]) -> int | None:
    """What the smallest rank has left after its weights (RankState: host_memory_total, active_memory), within
    what its GPU may wire (gpu_working_set: Metal wires about 3/4 of a Mac's RAM, not all of it); None when no
    rank reports its memory."""
    left = [min(r.host_memory_total, r.gpu_working_set or r.host_memory_total) - r.active_memory
            for r in ranks if r.host_memory_total]
    return min(left) if left else None


def memory_budget(setting: int, ranks: Sequence[Any]) -> int:
    """KV_MEMORY_BYTES, or for -1 half of memory_left; 0 (no limit) when no rank reports its memory."""
    if setting >= 0:
        return setting
    left = memory_left(ranks)
    return max(1, left // DEFAULT_SHARE) if left is not None else 0


def size(n: int) -> str:
    """Bytes for people: MiB or GiB."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


@dataclass(frozen=True)
class KVMemory:
    """What one sequence's caches take on one rank, as measured from the model's own caches at load."""

    token_bytes: int = 0  # per token, layers that keep every token (KV, MLA latent, quantized KV)
    window_token_bytes: int = 0  # per token, sliding-window layers, up to their window
    window: int = 0  # tokens a sliding-window layer keeps once decoding (its max_size)
    constant_bytes: int = 0  # per sequence, whatever its length (linear attention's state)

    def row(self) -> list[int]:
        """As int32s for the ranks' startup exchange (each value split in two 31-bit halves)."""
        return [part for v in (self.token_bytes, self.window_token_bytes, self.window, self.constant_bytes)
                for part in (v >> 31, v & 0x7FFFFFFF)]

    @classmethod
    def from_row(cls, row: Sequence[int]) -> KVMemory:
        return cls(*((row[i] << 31) | row[i + 1] for i in range(0, 8, 2)))

    def describe(self) -> str:
        """One token's bytes and whatever else a sequence holds, for people."""
        parts = [f"{self.token_bytes} bytes per token"]
        if self.window_token_bytes:
            parts.append(f"{self.window_token_bytes} bytes per token of a {self.window}-token window")
        if self.constant_bytes:
            parts.append(f"{self.constant_bytes} bytes of state per sequence")
        return " + ".join(parts)

    @classmethod
    def largest(cls, ranks: Iterable[KVMemory]) -> KVMemory:
        """An upper bound of every rank's: each number the largest any rank has."""
        ranks = list(ranks)
        return cls(*(max((getattr(m, f) for m in ranks), default=0) for f in
                     ("token_bytes", "window_token_bytes", "window", "constant_bytes")))


@dataclass(frozen=True)
class KVBudget:
    """Bytes per rank for the running sequences' KV and the prefix cache together (0: no limit), and what
    one sequence takes on a rank (KVMemory's numbers; prefill_chunk: the most prompt tokens a sequence
    prefills in one step)."""

    budget: int
    token_bytes: int
    window_token_bytes: int = 0
    window: int = 0
    constant_bytes: int = 0
    prefill_chunk: int = 0

    @classmethod
    def of(cls, budget: int, memory: KVMemory, prefill_chunk: int) -> KVBudget:
        return cls(budget, memory.token_bytes, memory.window_token_bytes, memory.window, memory.constant_bytes,
                   prefill_chunk)

    @property
    def enabled(self) -> bool:
        return self.budget > 0 and (self.token_bytes + self.window_token_bytes + self.constant_bytes) > 0

    def window_tokens(self, tokens: int) -> int:
        """The most tokens a sliding-window layer holds for a sequence of this many tokens.

        mlx-lm's RotatingKVCache keeps every token of a prefill chunk next to the window's last
        window - 1 (so each sees a whole window), and below its window grows in steps of KV_STEP."""
        if not self.window:
            return steps(tokens)
        return max(min(tokens + KV_STEP - 1, self.window),
                   min(tokens, self.window + max(1, self.prefill_chunk) - 1))

    def sequence(self, prompt_tokens: int, max_tokens: int) -> int:
        """The most KV one sequence can take on a rank: its prompt and every token it may generate."""
        tokens = prompt_tokens + max_tokens
        capped = self.window_token_bytes * self.window_tokens(tokens) if self.window_token_bytes else 0
        return self.token_bytes * steps(tokens) + capped + self.constant_bytes

    def room(self, prompt_tokens: int, n: int = 1) -> int | None:
        """The most tokens each of n sequences of this prompt may generate, alone in the batch with the prefix
        cache empty (0 or less: not even one); None without a budget."""
        if not self.enabled:
            return None
        # sequence() never shrinks as tokens grow: the longest sequence that fits, by bisection
        lo, hi = 0, NO_GROWTH_TOKENS
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if n * self.sequence(mid, 0) <= self.budget else (lo, mid - 1)
        return lo - prompt_tokens

    @property
    def memory(self) -> KVMemory:
        return KVMemory(self.token_bytes, self.window_token_bytes, self.window, self.constant_bytes)

    def refusal(self, prompt_tokens: int, max_tokens: int, n: int = 1, *, client_limit: bool = True) -> str | None:
        """Why a request's n choices could never fit, even alone in the batch with the prefix cache empty;
        None when they can. Without a client_limit, max_tokens was the server's choice: lowering it is no advice."""
        if not self.enabled:
            return None
        need = n * self.sequence(prompt_tokens, max_tokens)
        if need <= self.budget:
            return None
        choices = f"{n} choices x " if n > 1 else ""
        fixes = ["lower max_tokens"] * client_limit + ["shorten the prompt"] + ["ask for fewer choices (n)"] * (n > 1)
        return (f"this request's KV cache would need up to {need} bytes ({size(need)}) per rank: {choices}"
                f"{steps(prompt_tokens + max_tokens)} tokens ({prompt_tokens} prompt + {max_tokens} max_tokens, in "
                f"steps of {KV_STEP}) x {self.memory.describe()}, but the engine's KV memory budget is "
                f"{self.budget} bytes ({size(self.budget)}) per rank (KV_MEMORY_BYTES); {', '.join(fixes)} or raise "
                "KV_MEMORY_BYTES")
