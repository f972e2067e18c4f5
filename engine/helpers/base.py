"""What every helper model (an embedder, a reranker) offers rank 0, whatever its family.

A helper is pinned on rank 0 beside the served model and never joins the big model's plan: rank 0 runs its
work between steps (engine/helpers/work.py). Each family is a module under engine/helpers/families/.
"""

from __future__ import annotations

from typing import Literal, Protocol

import mlx.core as mx


class Helper(Protocol):
    kind: Literal["embedding", "rerank"]
    name: str                 # what /v1/models lists
    max_tokens: int           # longest input (embedding) or query+document pair (rerank) the model takes
    dimensions: int           # embedding width (0 for rerank)
    matryoshka: bool          # embedding may be truncated to fewer dimensions (then renormalized)
    def tokenize(self, text: str) -> list[int]: ...          # with the special tokens the model's card adds
    def embed(self, batch: list[list[int]]) -> "mx.array":   # [n, dimensions] float32, pooled and normalized as the card says
        ...
    # rerank: one scored input, as the card formats it; limit cuts the document's end (never the query) to fit
    def pair_tokens(self, query: str, document: str, limit: int | None = None) -> list[int]: ...
    def score(self, batch: list[list[int]]) -> "mx.array":   # rerank: [n] relevance in [0, 1]
        ...
    def weight_bytes(self) -> int: ...
