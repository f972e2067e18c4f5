"""The draft proposer: a small model of the target's tokenizer, held by rank 0 alone, proposes greedy tokens.

Rank 0 alone: the proposals travel in the plan, so no other rank needs the draft, and a draft on every rank would
cost each of them its memory and its forward passes for nothing. Each sequence keeps a draft KV cache across
steps, fed only the tokens it has not seen; when the history leaves what it fed (drafts the target rejected), the
cache is trimmed back to the common prefix, which mlx-lm's KVCache allows. The drafts a call proposes stay in
the cache, so the next call refeeds none that the target accepted and trims those it rejected.

One sequence at a time: merging the sequences' caches into one batch cache per call (mlx-lm's BatchKVCache.merge)
copies every cache each step, which measured slower here than a forward per sequence once contexts reach a few
thousand tokens; drafting several sequences in one forward needs a batch cache kept across steps that rolls back
per sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx
import msgspec

from config import Settings
from engine.mlx_compat import hf_tokenizer
from engine.model import ModelError, load_errors_explained, refuse_broken_folder, remote_code, resolve
from engine.vision.ids import FIRST

# A first call may carry a whole agent prompt: fed in chunks, as mlx-lm prefills, so the draft's activations
# stay bounded.
PREFILL_CHUNK = 2048


def tokenizer_mismatch(draft_tok: Any, target_tok: Any, draft_name: str = "the draft model",
                       target_name: str = "the target model") -> str | None:
    """One sentence naming both models when the draft's token ids would not mean the target's, else None."""
    why = _difference(hf_tokenizer(draft_tok), hf_tokenizer(target_tok), draft_tok, target_tok)
    if why is None:
        return None
    return (f"DRAFT_MODEL={draft_name} cannot propose tokens for MODEL={target_name}: their tokenizers differ "
            f"({why}); choose a draft model of the target's family, which shares its tokenizer")


def _difference(draft: Any, target: Any, draft_wrap: Any, target_wrap: Any) -> str | None:
    dv, tv = draft.get_vocab(), target.get_vocab()
    if len(dv) != len(tv):
        return f"a vocabulary of {len(dv)} tokens against {len(tv)}"
    for token, tid in tv.items():
        if dv.get(token) != tid:
            return f"token {token!r} is id {dv.get(token)} in the draft and {tid} in the target"
    ds, ts = _specials(draft), _specials(target)
    if ds != ts:
        extra = sorted(set(ds.items()) ^ set(ts.items()))
        return f"special tokens differ: {', '.join(f'{t!r}={i}' for t, i in extra[:3])}"
    de, te = sorted(getattr(draft_wrap, "eos_token_ids", ())), sorted(getattr(target_wrap, "eos_token_ids", ()))
    if de != te:
        return f"end-of-sequence ids {de} against {te}"
    return None


def _specials(tok: Any) -> dict[str, int]:
    return {t: tok.convert_tokens_to_ids(t) for t in tok.all_special_tokens}


def load_draft(settings: Settings) -> tuple[Any, Any, str]:
    """DRAFT_MODEL resolved like MODEL (demo or zoo name, folder, repo id from rank 0's cache) and loaded."""
    from mlx_lm import load as mlx_load
    from mlx_lm.models.cache import KVCache, make_prompt_cache

    if not settings.DRAFT_MODEL:
        raise ModelError("SPECULATIVE=draft needs DRAFT_MODEL: a small model of the target's tokenizer "
                         "(a folder, a repo id in the cache, or a demo or zoo name)")
    draft = msgspec.structs.replace(settings, MODEL=settings.DRAFT_MODEL)
    try:
        path = resolve(draft, rank=0)
    except ModelError as exc:  # resolve's sentences start with the setting it read: here, DRAFT_MODEL
        raise ModelError(str(exc).replace("MODEL=", "DRAFT_MODEL=", 1)) from exc
    try:
        refuse_broken_folder(draft, path)
        with load_errors_explained(draft, path):
            model, tokenizer = mlx_load(str(path), tokenizer_config=remote_code(settings), **remote_code(settings))
    except ModelError as exc:
        raise ModelError(f"DRAFT_MODEL={settings.DRAFT_MODEL!r}: {exc}") from exc
    # Rejected drafts are trimmed off: a plain KVCache trims at any length (a sliding window's cache cannot once
    # full, a linear-attention state never).
    other = sorted({type(c).__name__ for c in make_prompt_cache(model) if not isinstance(c, KVCache)})
    if other:
        raise ModelError(f"DRAFT_MODEL={settings.DRAFT_MODEL!r} keeps caches that cannot roll back rejected "
                         f"drafts ({', '.join(other)}); choose a draft whose layers all use full attention")
    return model, tokenizer, str(path)


@dataclass
class _Sequence:
    cache: list
    fed: list[int] = field(default_factory=list)  # the tokens whose KV the cache holds, in order


class DraftProposer:
    """Rank 0's draft model and one draft cache per decoding sequence, dropped when the sequence leaves."""

    def __init__(self, settings: Settings, tokenizer: Any, *, model: Any = None) -> None:
        if model is None:
            model, draft_tok, _ = load_draft(settings)
            if problem := tokenizer_mismatch(draft_tok, tokenizer, settings.DRAFT_MODEL, settings.MODEL):
                raise ModelError(problem)
        self.model = model
        self._seqs: dict[str, _Sequence] = {}

    def propose(self, histories: dict[str, list[int]], k: int) -> dict[str, list[int]]:
        return {rid: self._propose_one(rid, history, k) for rid, history in histories.items() if history and k > 0}

    def forget(self, rid: str) -> None:
        self._seqs.pop(rid, None)

    def cached_tokens(self) -> int:
        """Tokens held in draft caches, over every sequence (what forgetting frees)."""
        return sum(len(s.fed) for s in self._seqs.values())

    def _propose_one(self, rid: str, history: list[int], k: int) -> list[int]:
        from mlx_lm.models.cache import make_prompt_cache

        seq = self._seqs.get(rid)
        if seq is None:
            seq = self._seqs[rid] = _Sequence(make_prompt_cache(self.model))
        self._rewind(seq, history)
        pending = history[len(seq.fed):]
        while len(pending) > PREFILL_CHUNK:
            self._feed(seq, pending[:PREFILL_CHUNK])
            mx.eval([c.state for c in seq.cache])
            pending = pending[PREFILL_CHUNK:]
        out: list[int] = []
        for _ in range(k):
            logits = self._feed(seq, pending)
            token = int(mx.argmax(logits[-1]).item())
            out.append(token)
            pending = [token]
        # The cache keeps out[:-1]: the next call trims whatever of them the target rejected.
        return out

    def _rewind(self, seq: _Sequence, history: list[int]) -> None:
        """Trim the cache to the longest prefix it shares with history, keeping at least the last token to feed."""
        from mlx_lm.models.cache import trim_prompt_cache

        limit = min(len(seq.fed), len(history) - 1)
        keep = limit if seq.fed[:limit] == history[:limit] else 0  # the usual case, compared at C speed
        while keep < limit and seq.fed[keep] == history[keep]:
            keep += 1
        if keep < len(seq.fed):
            trim_prompt_cache(seq.cache, len(seq.fed) - keep)
            del seq.fed[keep:]

    def _feed(self, seq: _Sequence, tokens: list[int]) -> mx.array:
        # the draft model sees no picture: an image's ids (past every vocabulary) are fed as token 0
        logits = self.model(mx.array([0 if t >= FIRST else t for t in tokens], dtype=mx.uint32)[None],
                            cache=seq.cache)[0]
        seq.fed.extend(tokens)
        return logits
