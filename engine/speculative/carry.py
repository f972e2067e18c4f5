"""HiddenCarry: per sequence, the main model's post-norm hidden at its last fed position, kept as a cache layer.

SPECULATIVE=mtp's heads take (hidden at p-1, token at p); the hidden of the last fed position is needed by the next
forward pass and by the drafting chain. Held as one more cache layer (an ArraysCache of size 1), it is merged,
filtered, extended and extracted by mlx-lm's BatchGenerator, and stored by the prefix cache and the disk tier, with
the rest of the sequence's state. Like a linear-attention state it cannot be trimmed: a prefix entry is reused only
where a prompt extends it exactly (engine/lockstep/cuts.py), which is what its value (the hidden at its end) needs.
"""

from __future__ import annotations

from mlx_lm.models.cache import ArraysCache


class HiddenCarry(ArraysCache):
    def __init__(self, size: int = 1, left_padding=None) -> None:
        super().__init__(1, left_padding)

    def extract(self, idx):
        out = HiddenCarry()
        out.cache = [c[idx:idx + 1] if c is not None else None for c in self.cache]
        return out
