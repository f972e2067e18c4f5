"""Can mlx-lm's shard() split this model over N ranks? Asked of the model itself, for every family alike.

shard() divides head counts with `//` (`n_heads //= N`) and slices weights by them, so a count the ranks do
not divide (SmolLM2's 9 heads on 2 ranks) loads fine and fails every request with mismatched attention
shapes. No table of families can keep up with mlx-lm's: instead shard() runs on the lazily built model (no
weight is read) with a stand-in group of N ranks, and every count it divided unevenly is reported, as is a
weight it refused to slice (MoE intermediate sizes, fused projections, mlx-lm's own asserts).
"""

from __future__ import annotations

import logging
import re
from typing import Any

log = logging.getLogger(__name__)

# The words for the counts most families divide; any other count is named by its attribute path.
_WORDS = {"n_heads": "attention heads", "num_heads": "attention heads", "num_attention_heads": "attention heads",
          "n_kv_heads": "KV heads", "num_key_value_heads": "KV heads", "num_kv_heads": "KV heads"}


class _Ranks:
    """A group of `size` ranks as shard() sees it while slicing: only size() and rank() are asked."""

    def __init__(self, size: int):
        self._size = size

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return 0


def unsplit(model: Any, ranks: int) -> str:
    """Why `ranks` ranks cannot hold slices of this (lazily built, disposable: it is sharded here) model, as a
    clause ("tensor parallel needs 9 attention heads (self_attn.n_heads) ... divisible by 2 ranks"); empty when
    shard() splits it evenly."""
    before = _counts(model)
    try:
        model.shard(_Ranks(ranks))
    except (ValueError, AssertionError, ArithmeticError) as exc:  # sliced weights, mlx-lm's own checks, 2 // 4
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(".").replace(". ", "; ")
        return f"mlx-lm's shard() cannot split it over {ranks} ranks ({said})"
    except Exception:  # noqa: BLE001 - a shard() asking more of the group than this stand-in knows: no verdict
        log.warning("could not ask %s's shard() whether %d ranks divide it", type(model).__module__, ranks,
                    exc_info=True)
        return ""
    after = _counts(model)
    uneven: dict[str, int] = {}
    for key, value in before.items():
        now = after.get(key, value)
        if now < value and now * ranks != value:  # divided, unevenly (counts derived from them may grow)
            uneven.setdefault(re.sub(r"^.*\blayers\.\d+\.", "", key), value)
    if not uneven:
        return ""
    counts = " and ".join(_named(path, value) for path, value in uneven.items())
    return f"tensor parallel needs {counts} divisible by {ranks} ranks"


def _counts(model: Any) -> dict[str, int]:
    """Every integer attribute of every module, by its path (a module's plain attributes hold its counts)."""
    return {f"{name}.{attr}" if name else attr: value
            for name, module in model.named_modules()
            for attr, value in vars(module).items()
            if type(value) is int}


def _named(path: str, value: int) -> str:
    attr = path.rsplit(".", 1)[-1]
    return f"{value} {_WORDS[attr]} ({path})" if attr in _WORDS else f"{value} ({path})"
