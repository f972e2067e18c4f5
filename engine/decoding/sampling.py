"""Per-request samplers and logits processors, identical on every rank.

Each request carries its own seed; the key of its n-th sampled token is derived from
(seed, n) alone, so a seeded request gives the same tokens whatever else shares the batch
and on any number of ranks.
"""

from __future__ import annotations


import mlx.core as mx
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_logits_processors

from engine.decoding.constrained import GrammarError, Grammars
from engine.lockstep.plan import Insert
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
        """The token at this position of a speculative step, and whether it is the draft: speculative sampling
        for a proposal that is certain of its draft (q = one-hot), so the token keeps this sampler's
        distribution p whatever was proposed. The draft is kept with probability p(draft); else the token is
        drawn from p without it. Without a draft, exactly as __call__ would sample it. One key per token index."""
        key = self._next_key()
        logits = self._tempered(logprobs)
        if draft is None:
            return mx.random.categorical(logits, key=key).item(), False
        k_accept, k_other = mx.random.split(key)
        width = logits.shape[-1]
        if 0 <= draft < width:
            p_draft = mx.exp(logits[0, draft] - mx.logsumexp(logits[0]))
            if mx.random.uniform(key=k_accept).item() < p_draft.item():
                return draft, True
            logits = mx.where(mx.arange(width) == draft, mx.array(-mx.inf, dtype=logits.dtype), logits)
        return mx.random.categorical(logits, key=k_other).item(), False

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
    """mlx-lm's logits processors for the request's bias and penalties, then its grammar mask.

    The mask goes last so that no bias can revive a token the grammar forbids. Raises GrammarError
    for a grammar when there are no grammars to compile it with.
    """
    processors = make_logits_processors(
        logit_bias=ins.logit_bias or None,
        repetition_penalty=ins.repetition_penalty,
        presence_penalty=ins.presence_penalty,
        frequency_penalty=ins.frequency_penalty,
    )
    if ins.grammar:
        if grammars is None:
            raise GrammarError("this batch was built without grammars")
        processors.append(grammars.processor(ins.grammar))
    return processors
