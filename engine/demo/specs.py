"""The demo models' sizes (plain data: `launch.sh check` reads DEMO_MODELS without importing the project)."""

from __future__ import annotations

from dataclasses import dataclass

DEMO_MODELS = ("tiny", "small")


@dataclass(frozen=True)
class Spec:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    filler_words: int  # pseudo-words added to the tokenizer corpus (engine/modelgen/tokenizer.py)


SPECS = {
    "tiny": Spec(hidden=64, layers=2, heads=4, kv_heads=4, head_dim=16, intermediate=128, vocab=1024, filler_words=0),
    "small": Spec(hidden=256, layers=8, heads=8, kv_heads=4, head_dim=32, intermediate=1024, vocab=4096,
                  filler_words=2400),
}
