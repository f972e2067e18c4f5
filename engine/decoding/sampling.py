"""Per-request samplers and logits processors, identical on every rank.

Each request carries its own seed; the key of its n-th sampled token is derived from
(seed, n) alone, so a seeded request gives the same tokens whatever else shares the batch,
whatever drafts it was offered, and on any number of ranks.
"""

from __future__ import annotations


import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from engine.decoding.constrained import GrammarError, Grammars
from engine.decoding.penalties import OutputPenalties
from engine.lockstep.plan import Insert
from engine.vision.ids import FIRST, has_images
from ipc.test_hooks import hook


def failpoint_seed(kind: str) -> int | None:
    """Tests only (with MCS_TEST_HOOKS=1): ENGINE_FAILPOINT="<kind>:<seed>" makes requests with that seed fail
    inside the step.

    "sampler": the request's sampler raises from its third token on, as a value mlx-lm rejects would;
    "step": the whole batched step raises (engine/lockstep/batch.py), losing every request in it.
    """
    mode, _, seed = hook("ENGINE_FAILPOINT").partition(":")
    return int(seed) if mode == kind and seed.isdigit() else None


_FAIL_SEED = failpoint_seed("sampler")


class SeededSampler:
    """Temperature sampling with top_p/top_k/min_p filters and a per-request key sequence."""

    def __init__(self, seed: int, temperature: float, top_p: float, top_k: int, min_p: float):
        self.seed = seed & 0xFFFFFFFF
        self.inv_temp = 1.0 / temperature
        self.top_p = top_p
        self.top_k = top_k
        self.min_p = min_p
        self.count = 0

    def __call__(self, logprobs: mx.array) -> mx.array:
        return mx.random.categorical(self._tempered(logprobs), key=self._next_key())

    def choose(self, logprobs: mx.array, draft: int | None) -> tuple[int, bool]:
        """The token at this position of a speculative step, and whether it is the draft: drawn with this
        position's key exactly as __call__ would draw it, the draft kept when the draw equals it. For a proposal
        certain of its draft this is exact speculative sampling (kept with probability p(draft), else a token
        from p without it), and a seed gives the tokens plain decoding gives, whatever was proposed."""
        token = self(logprobs).item()
        return token, token == draft

    def _next_key(self) -> mx.array:
        key = mx.random.key((self.seed << 20) + self.count)
        self.count += 1
        if _FAIL_SEED is not None and self.seed == _FAIL_SEED and self.count > 2:
            raise RuntimeError("failpoint: the sampler of a request with ENGINE_FAILPOINT's seed")
        return key

    def _tempered(self, logprobs: mx.array) -> mx.array:
        """The logits this sampler draws from: filtered, then divided by the temperature."""
        if 0.0 < self.top_p < 1.0:
            logprobs = apply_top_p(logprobs, self.top_p)
        if self.min_p > 0.0:
            logprobs = apply_min_p(logprobs, self.min_p)
        if self.top_k > 0:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs * self.inv_temp


def make_sampler(ins: Insert) -> SeededSampler | None:
    """None means greedy: the batch's shared argmax sampler (batched in one call)."""
    if ins.temperature <= 0.0:
        return None
    return SeededSampler(ins.seed, ins.temperature, ins.top_p, ins.top_k, ins.min_p)


def make_processors(ins: Insert, grammars: Grammars | None) -> list:
    """mlx-lm's logits processors for the request's bias and repetition penalty, OpenAI's presence and frequency
    penalties over the whole output (engine/decoding/penalties.py), then its grammar mask.

    The mask goes last so that no bias can revive a token the grammar forbids. Raises GrammarError
    for a grammar when there are no grammars to compile it with.
    """
    processors = make_logits_processors(
        logit_bias=ins.logit_bias or None,
        repetition_penalty=ins.repetition_penalty,
    )
    if ins.repetition_penalty and has_images(ins.tokens):  # ins.images leaves out those a prefix hit holds
        # it reads the logits at the last prompt tokens, and an image's tokens have ids past the vocabulary
        processors = [_text_only(p) if i == len(processors) - 1 else p for i, p in enumerate(processors)]
    if ins.presence_penalty or ins.frequency_penalty:
        processors.append(OutputPenalties(ins.presence_penalty or 0.0, ins.frequency_penalty or 0.0))
    if ins.grammar:
        if grammars is None:
            raise GrammarError("this batch was built without grammars")
        processors.append(grammars.processor(ins.grammar))
    return processors


def _text_only(processor):
    """A processor of the context that sees image tokens (engine/vision/ids.py) as token 0: never out of range."""

    def call(tokens, logits):
        tokens = tokens if isinstance(tokens, mx.array) else mx.array(tokens)
        return processor(mx.where(tokens >= FIRST, 0, tokens), logits)

    return call
