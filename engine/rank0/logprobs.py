"""Rank 0: OpenAI-shaped logprobs (token, logprob, bytes, top alternatives) from a step's rows.

Only requests that asked pay for this: one gather and, with top_logprobs, one argpartition per
request and step. The logprobs are those mlx-lm samples from: after logit_bias, penalties and
any grammar mask, before temperature.
"""

from __future__ import annotations

import re
from typing import Any

import mlx.core as mx

from engine import mlx_compat
from engine.rank0.prompt_logprobs import floor as _floor
from ipc.messages import TokenLogprob, TopLogprob

_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class TokenTexts:
    """The text and exact UTF-8 bytes of single tokens, computed once per token id."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        self._pieces = mlx_compat.byte_level_pieces(tokenizer)

    def get(self, tid: int) -> tuple[str, list[int]]:
        hit = self._cache.get(tid)
        if hit is None:
            raw = self._bytes(tid)
            hit = self._cache[tid] = (raw.decode("utf-8", "replace"), list(raw))
        return hit

    def _bytes(self, tid: int) -> bytes:
        if self._pieces is not None:
            if tid >= len(self._pieces):
                return b""
            table = mlx_compat.byte_decoder()
            return b"".join(bytes([table[c]]) if c in table else c.encode() for c in self._pieces[tid])
        piece = self.tokenizer.convert_ids_to_tokens(tid)
        if piece is None:
            return b""
        if "\u2581" in piece or _SPM_BYTE.fullmatch(piece):  # sentencepiece: "▁" is a space, <0xNN> a byte
            m = _SPM_BYTE.fullmatch(piece)
            return bytes([int(m.group(1), 16)]) if m else piece.replace("\u2581", " ").encode()
        return self.tokenizer.decode([tid]).encode()


def extract(texts: TokenTexts, asks: list[tuple[int, mx.array, int]]) -> list[TokenLogprob]:
    """One TokenLogprob per (sampled token, logprob row, how many alternatives) in asks."""
    if not asks:
        return []
    chosen = [row[tok] for tok, row, _ in asks]
    tops = []
    for _, row, k in asks:
        if k > 0:
            idx = mx.argpartition(-row, kth=k - 1)[:k]
            tops.append((idx, row[idx]))
        else:
            tops.append(None)
    mx.eval(chosen, [t for t in tops if t is not None])
    out = []
    for (tok, _, _), lp, top in zip(asks, chosen, tops):
        alternatives = []
        if top is not None:
            pairs = sorted(zip(top[1].tolist(), top[0].tolist()), key=lambda p: -p[0])
            for value, tid in pairs:
                text, raw = texts.get(tid)
                alternatives.append(TopLogprob(token=text, logprob=_floor(value), bytes=raw))
        text, raw = texts.get(tok)
        out.append(TokenLogprob(token=text, logprob=_floor(lp.item()), bytes=raw, top=alternatives))
    return out
