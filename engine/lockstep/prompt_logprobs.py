"""Prompt logprobs: each prompt token's log probability given the tokens before it, from the prefill passes.

Every rank computes them alike, right after the prefill forward pass that made the logits: evaluating a pass's
logits runs its last layers' collectives (tensor parallel all_sums, pipeline's all_gather), which every rank must
join in the same order. Only rank 0 reads the values. Each pass keeps, per asking sequence and position, the
next token's logprob and the top-k alternatives; the logits themselves (tokens x vocabulary) are let go at once,
and the log-softmax runs over at most SLICE positions at a time in float32.
"""

from __future__ import annotations

import mlx.core as mx

from engine.lockstep.results import PromptRows

# positions whose float32 log-softmax is computed at once: bounds the extra memory to SLICE x vocabulary x 4 bytes
SLICE = 256


class PromptLogprobs:
    """The sequences that asked for their prompt's logprobs (by the batch's uid), and what the passes gave them."""

    def __init__(self) -> None:
        self.asks: dict[int, tuple[list[int], int]] = {}  # uid -> (the whole prompt, alternatives per position)
        self.rows: dict[int, list[PromptRows]] = {}  # uid -> rows computed since the last take

    def ask(self, uid: int, tokens: list[int], top: int) -> None:
        self.asks[uid] = (tokens, top)

    def forget(self, uids) -> None:
        for uid in uids:
            self.asks.pop(uid, None)
            self.rows.pop(uid, None)

    def take(self) -> dict[int, list[PromptRows]]:
        rows, self.rows = self.rows, {}
        return rows

    def on_logits(self, uids: list[int], before: list[int], fed: list[int], logits: mx.array) -> None:
        """One prefill pass (engine/mlx_compat.py tap_prefill): the rows of the sequences that asked."""
        for i, uid in enumerate(uids):
            ask = self.asks.get(uid)
            if ask is None or not fed[i]:
                continue
            tokens, top = ask
            # position p's logits predict token p + 1; the prompt's last token is fed by decoding, never here
            start, n = before[i], min(fed[i], len(tokens) - 1 - before[i])
            for s in range(0, n, SLICE):
                m = min(SLICE, n - s)
                self.rows.setdefault(uid, []).append(
                    _rows(logits[i, s:s + m], tokens[start + s + 1:start + s + m + 1], top, start + s))


def _rows(logits: mx.array, targets: list[int], top: int, start: int) -> PromptRows:
    x = logits.astype(mx.float32)
    lse = mx.logsumexp(x, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(x, mx.array(targets)[:, None], axis=-1)[:, 0] - lse[:, 0]
    if top > 0:
        ids = mx.argpartition(-x, kth=top - 1, axis=-1)[:, :top]
        values = mx.take_along_axis(x, ids, axis=-1) - lse
        mx.eval(chosen, ids, values)
        return PromptRows(start, chosen.tolist(), ids.tolist(), values.tolist())
    mx.eval(chosen)
    return PromptRows(start, chosen.tolist(), [], [])
