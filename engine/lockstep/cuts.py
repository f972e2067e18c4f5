"""Which prefix cache entries can be cut short: a rule every rank derives from its model's cache kinds at load
(engine/lockstep/prefix.py: model_cuts), and rank 0 applies without MLX (engine/rank0/prefix_index.py).

A plain KV cache (and MLA's latent, kept in one) can drop its last tokens, so an entry serves any prompt that
shares a prefix with it. A linear-attention state (ArraysCache) folds every token into a constant-size state
and cannot; a sliding-window cache (RotatingKVCache) can until it has wrapped, once it holds `window` tokens.
An entry that cannot be cut serves only prompts that extend it exactly.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CacheCuts:
    """whole_only: some layer's cache can never be cut; window: the smallest sliding window (0: none)."""

    whole_only: bool = False
    window: int = 0

    def can_cut(self, length: int) -> bool:
        """Whether an entry of `length` tokens can give a shorter prefix of itself (as mlx-lm's is_trimmable
        says of every layer's cache holding that many tokens)."""
        return not self.whole_only and (not self.window or length < self.window)

    def reusable(self, length: int, shared: int) -> int:
        """Tokens an entry of `length` tokens can give a prompt sharing `shared` of them: all it shares when it
        can be cut, else all of it or nothing."""
        if shared >= length or self.can_cut(length):
            return min(shared, length)
        return 0

    def row(self) -> list[int]:
        """As int32s for the startup gather: [whole_only, window]."""
        return [int(self.whole_only), self.window]

    @staticmethod
    def strictest(rows: list[list[int]]) -> CacheCuts:
        """The rule every rank can keep: in pipeline parallel each rank holds other layers, so one rank's may be
        cut where another's cannot; an entry is cut only where every rank's layers allow it."""
        windows = [w for _, w in rows if w > 0]
        return CacheCuts(whole_only=any(whole for whole, _ in rows), window=min(windows, default=0))
