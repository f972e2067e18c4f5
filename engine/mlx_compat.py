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


def batch_caches(gen: Any) -> list[list[Any]]:
    """The per-layer caches of a BatchGenerator's batches (being prefilled, decoding)."""
    return [gen._prompt_batch.prompt_cache, gen._generation_batch.prompt_cache]


def tap_prefill(gen: Any, on_logits) -> None:
    """Have a BatchGenerator call on_logits(uids, fed, lengths, logits) after each prefill forward pass: the
    sequences' uids, each one's tokens in its cache before the pass, the tokens it fed in the pass and the pass's
    logits (batch, tokens, vocabulary; right padded). mlx-lm's PromptProcessingBatch.prompt drops them."""
    batch = gen._prompt_batch  # kept for the generator's life: filtered and extended, never replaced
    prompt = type(batch).prompt

    def prompt_keeping_logits(tokens: list[list[int]]) -> None:
        model = batch.model
        before = [len(t) for t in batch.tokens]
        left = [len(t) for t in tokens]

        def forward(inputs, cache=None):
            logits = model(inputs, cache=cache)
            width = inputs.shape[1]
            fed = [min(width, n) for n in left]
            on_logits(list(batch.uids), list(before), fed, logits)
            for i, n in enumerate(fed):
                before[i] += n
                left[i] -= n
            return logits

        batch.model = forward
        try:
            prompt(batch, tokens)
        finally:
            batch.model = model

    batch.prompt = prompt_keeping_logits


def step_with_decoding(gen: Any, decode) -> list:
    """One BatchGenerator step whose decoding half is decode(generation batch) -> responses instead of mlx-lm's
    own one-token step; prefill and the move of prefilled prompts into decoding happen as in gen.next()."""
    batch = gen._generation_batch
    batch.next = lambda: decode(batch)  # BatchGenerator._next calls self._generation_batch.next()
    try:
        return gen.next()[1]
    finally:
        del batch.next


class Decoding:
    """mlx-lm's GenerationBatch as a speculative step reads and updates it.

    mlx-lm samples each sequence's next input one step ahead (`_next_tokens`, with the logprob rows they were
    sampled from) and returns a token once it has been fed: `tokens` always holds what the cache holds.
    """

    def __init__(self, batch: Any):
        self.batch = batch

    def __len__(self) -> int:
        return len(self.batch.uids)

    @property
    def model(self) -> Any:
        return self.batch.model

    @property
    def uids(self) -> list[int]:
        return self.batch.uids

    @property
    def cache(self) -> list:
        return self.batch.prompt_cache

    def sampler(self, i: int) -> Any:
        """The sequence's own sampler, None for the batch's greedy one (mlx-lm puts that in for None)."""
        sampler = self.batch.samplers[i] if self.batch.samplers else None
        return None if sampler is self.batch.fallback_sampler else sampler

    def processors(self, i: int) -> tuple:
        return tuple(self.batch.logits_processors[i] or ()) if self.batch.logits_processors else ()

    def pending(self) -> tuple[list[int], list]:
        """Each sequence's next input (sampled, not yet fed) and the logprob row it was sampled from."""
        return self.batch._next_tokens.tolist(), list(self.batch._next_logprobs)

    def set_pending(self, fed, tokens: list[int], rows: list) -> None:
        import mlx.core as mx

        self.batch._current_tokens = fed
        self.batch._next_tokens = mx.array(tokens, dtype=fed.dtype)
        self.batch._next_logprobs = rows

    def context(self, i: int) -> Any:
        """The sequence's token buffer, as its logits processors see it (TokenBuffer)."""
        return self.batch._token_context[i]

    def remaining(self, i: int) -> int:
        """Tokens the sequence may still return before max_tokens ends it."""
        return self.batch.max_tokens[i] - self.batch._num_tokens[i]

    def count(self, i: int, token: int) -> str | None:
        """Count a returned token as mlx-lm does: its finish reason, if it ends the sequence."""
        self.batch._num_tokens[i] += 1
        reason = "length" if self.batch._num_tokens[i] >= self.batch.max_tokens[i] else None
        return "stop" if self.batch._matchers[i].advance(token) else reason

    def fed(self, i: int) -> list[int]:
        return self.batch.tokens[i]

    def response(self, i: int, token: int, row: Any, reason: str | None) -> Any:
        ended = reason is not None
        return self.batch.Response(uid=self.batch.uids[i], token=token, logprobs=row, finish_reason=reason,
                                   prompt_cache=self.batch.extract_cache(i) if ended else None,
                                   all_tokens=self.batch.tokens[i] if ended else None)

    def filter(self, keep: list[int]) -> None:
        if len(keep) < len(self.batch.uids):
            self.batch.filter(keep)


def decoding_batch(gen: Any) -> Any:
    """A BatchGenerator's GenerationBatch: the sequences it decodes, in their batch order."""
    return gen._generation_batch


def decoding_histories(gen: Any) -> dict[int, list[int]]:
    """uid -> every token a decoding sequence's cache holds, then its next input (sampled by the last step, fed by
    the next: mlx-lm's GenerationBatch reports a token one step after sampling it). Reading the next inputs waits
    for the last step to end."""
    batch = gen._generation_batch
    if not batch.uids or batch._next_tokens is None:
        return {}
    nexts = batch._next_tokens.tolist()
    return {uid: [*tokens, nxt] for uid, tokens, nxt in zip(batch.uids, batch.tokens, nexts)}


def next_inputs(gen: Any) -> tuple[list[int], Any]:
    """The decoding sequences' uids and their next inputs (an array; sampled by the last step, fed by the next)."""
    batch = gen._generation_batch
    if not batch.uids or batch._next_tokens is None:
        return [], None
    return list(batch.uids), batch._next_tokens
