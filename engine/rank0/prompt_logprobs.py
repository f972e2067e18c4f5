"""Rank 0: a prompt's logprobs (rows the prefill passes computed, engine/lockstep/prompt_logprobs.py) as the
TokenLogprobs a completion with echo reports, its first token without one (nothing comes before it).

No MLX here (the scheduler uses it): the rows are plain lists, and `texts` is engine/rank0/logprobs.py's
TokenTexts.
"""

from __future__ import annotations

from typing import Any

from ipc.messages import TokenLogprob, TopLogprob

# JSON has no -inf; OpenAI writes tokens that cannot occur with this floor.
FLOOR = -9999.0

# entries per Delta: a long prompt's logprobs travel in several events, each well within MAX_FRAME_BYTES
ENTRIES_PER_EVENT = 512


def first_entry(texts: Any, token: int) -> TokenLogprob:
    """The prompt's first token: OpenAI's and vLLM's null logprob and null alternatives."""
    text, raw = texts.get(token)
    return TokenLogprob(token=text, logprob=None, bytes=raw)


def entries(texts: Any, tokens: list[int], rows: list[Any]) -> list[TokenLogprob]:
    """One entry per prompt token the rows cover (row.start + 1 onwards), with its alternatives."""
    out = []
    for row in rows:
        for j, value in enumerate(row.chosen):
            text, raw = texts.get(tokens[row.start + 1 + j])
            top = []
            if row.top_ids:
                for tid, alt in sorted(zip(row.top_ids[j], row.top_values[j]), key=lambda p: -p[1]):
                    alt_text, alt_raw = texts.get(tid)
                    top.append(TopLogprob(token=alt_text, logprob=floor(alt), bytes=alt_raw))
            out.append(TokenLogprob(token=text, logprob=floor(value), bytes=raw, top=top))
    return out


def floor(value: float) -> float:
    """A number OpenAI's schema accepts: -inf (a masked token) and NaN (an overflowed row) become FLOOR."""
    return value if value >= FLOOR else FLOOR  # NaN compares false
