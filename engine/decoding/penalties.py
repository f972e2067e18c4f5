"""OpenAI's presence_penalty and frequency_penalty, over the whole output so far.

mlx-lm's processors look at the last 20 tokens of the context, prompt included; OpenAI subtracts
`frequency_penalty * count + presence_penalty * (count > 0)` from each token's logit, counting the tokens
generated so far. A processor sees the context at every sampled position (mlx-lm's step and each draft
position a speculative step verifies), always the prompt first: the first call is at the prompt's end, so
what follows its length is the output. A function of the context alone, so every rank computes it alike.
"""

from __future__ import annotations

import mlx.core as mx


class OutputPenalties:
    """One request's logits processor for OpenAI's two penalties (a zero penalty costs nothing)."""

    def __init__(self, presence: float, frequency: float):
        self.presence, self.frequency = presence, frequency
        self.prompt: int | None = None  # the context's length at the first call: the tokens before the output

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.prompt is None:
            self.prompt = len(tokens)
        output = tokens[self.prompt:]
        if output.size == 0:
            return logits
        # counted in float32: bfloat16 holds whole numbers exactly only up to 256
        counts = mx.zeros((logits.shape[-1],), dtype=mx.float32).at[output].add(1)
        return logits - (counts * self.frequency + (counts > 0) * self.presence).astype(logits.dtype)
