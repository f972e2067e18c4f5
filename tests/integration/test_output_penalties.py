"""presence_penalty and frequency_penalty as OpenAI applies them: over every token generated so far (not mlx-lm's
last 20 tokens, not the prompt), alike in plain and in speculative steps. In tests/integration: MLX."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.decoding.sampling import make_processors
from engine.lockstep.batch import LockstepBatch
from engine.lockstep.plan import Insert, Plan
from tests.integration.test_speculative_sampling import TABLE, Markov

V = 16


def test_penalties_count_the_whole_output_and_not_the_prompt():
    prompt = mx.array([3, 3, 3, 4], dtype=mx.int32)
    # 40 generated tokens: token 5 twelve times, all more than 20 tokens back; token 6 in the last 20 only
    output = [5] * 12 + [7] * 8 + [6] * 20
    processors = make_processors(Insert(rid="r", tokens=prompt.tolist(), max_tokens=64, presence_penalty=0.5,
                                        frequency_penalty=1.5), None)

    def penalised(tokens: mx.array) -> mx.array:
        logits = mx.zeros((1, V))
        for processor in processors:
            logits = processor(tokens, logits)
        return logits

    assert penalised(prompt).tolist() == [[0.0] * V]  # the first call, at the prompt's end: nothing generated yet
    got = np.array(penalised(mx.concatenate([prompt, mx.array(output, dtype=mx.int32)]))[0])
    want = np.zeros(V)
    for token in set(output):
        want[token] = -(1.5 * output.count(token) + 0.5)
    assert np.allclose(got, want), got  # token 3, the prompt's, is not penalised; token 5 is, 20+ tokens on


def greedy(frequency_penalty: float, drafts: bool) -> list[int]:
    batch = LockstepBatch(Markov(), set(), 64, 4)
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=[
        Insert(rid="r", tokens=[0, 3], max_tokens=48, temperature=0.0, frequency_penalty=frequency_penalty)]))
    out: list[int] = []
    while len(batch):
        # drafts that are often right: the last token twice, then its successor
        res = batch.step({"r": [out[-1], out[-1], (out[-1] + 1) % 4]} if drafts and out else None)
        assert not res.failed
        out += [token for _, token, _ in res.tokens]
    return out


def expected(frequency_penalty: float, window: int | None) -> list[int]:
    """The chain's greedy output with the penalty counting the whole output (window None, OpenAI's rule) or the
    context's last `window` tokens, prompt included (mlx-lm's)."""
    out: list[int] = []
    for _ in range(48):
        seen = out if window is None else ([0, 3] + out)[-window:]
        counts = np.bincount(np.array(seen, dtype=int), minlength=4)
        out.append(int(np.argmax(TABLE[out[-1] if out else 3] - frequency_penalty * counts)))
    return out


def test_a_frequency_penalty_acts_past_twenty_tokens_and_alike_with_drafts():
    assert greedy(0.0, False)[2:] == [1] * 46  # the chain's likeliest loop
    penalised = greedy(1.5, False)
    assert expected(1.5, 20) != expected(1.5, None)  # the two rules part within 48 tokens
    assert penalised == expected(1.5, None)
    assert greedy(1.5, True) == penalised
