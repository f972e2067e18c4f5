"""Every use of mlx-lm's private internals, in one place.

mlx-lm has no public API for these; they were read from mlx-lm 0.32 (pyproject pins the minor
version) and tests/integration/test_mlx_compat.py exercises each one, so an upgrade that moves
them fails there rather than deep inside a batched step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mlx_lm.tokenizer_utils import _byte_decoder


def batch_occupancy(gen: Any) -> tuple[int, int, int]:
    """(decoding, prefilling, waiting to prefill) sequences of a BatchGenerator."""
    return len(gen._generation_batch), len(gen._prompt_batch), len(gen._unprocessed_sequences)


def set_prefill_chunk(gen: Any, tokens: int) -> None:
    """Prompt tokens per sequence for the generator's next prefill steps."""
    # mlx-lm reads the chunk from both the generator and its current prompt batch.
    gen.prefill_step_size = tokens
    gen._prompt_batch.prefill_step_size = tokens


def keep_leading_space(detokenizer: Any) -> None:
    """Make a streaming detokenizer keep the space its first token starts with.

    mlx-lm's BPE detokeniser drops a leading space; a byte-level BPE space is a byte the model
    sampled, so the text keeps it and stays equal to the tokens' bytes.
    """
    if hasattr(detokenizer, "_maybe_trim_space"):
        detokenizer._maybe_trim_space = _unchanged


def byte_level_pieces(tokenizer: Any) -> list[str] | None:
    """A byte-level BPE tokenizer's piece per token id (GPT-2 byte alphabet); None for other tokenizers."""
    return getattr(tokenizer._detokenizer, "tokenmap", None)


def byte_decoder() -> dict[str, int]:
    """GPT-2's byte alphabet: piece character -> the byte it stands for."""
    return _byte_decoder()


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer inside mlx-lm's TokenizerWrapper."""
    return tokenizer._tokenizer


def _unchanged(text: str) -> str:
    return text


def local_model_path(target: str, download: bool = True) -> Path:
    """MODEL's local folder (a repo id is fetched when absent, or only looked up in the cache without download)."""
    from mlx_lm.utils import _download, hf_repo_to_path

    return _download(target) if download or Path(target).exists() else hf_repo_to_path(target)


def fed_tokens(gen: Any) -> dict[int, int]:
    """uid -> tokens fed so far, of a BatchGenerator's sequences being prefilled or decoded (mlx-lm keeps each
    one's tokens, those it started from included, as its cache holds them)."""
    fed = {uid: len(t) for uid, t in zip(gen._prompt_batch.uids, gen._prompt_batch.tokens)}
    fed.update((uid, len(t)) for uid, t in zip(gen._generation_batch.uids, gen._generation_batch.tokens))
    return fed


def decoding_histories(gen: Any) -> dict[int, list[int]]:
    """uid -> every token a decoding sequence's cache holds, then its next input (sampled by the last step, fed by
    the next: mlx-lm's GenerationBatch reports a token one step after sampling it). Reading the next inputs waits
    for the last step to end."""
    batch = gen._generation_batch
    if not batch.uids or batch._next_tokens is None:
        return {}
    nexts = batch._next_tokens.tolist()
    return {uid: [*tokens, nxt] for uid, tokens, nxt in zip(batch.uids, batch.tokens, nexts)}
