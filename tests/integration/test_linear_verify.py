"""Linear-attention hybrids (Qwen3.5, Qwen3-Next) verify drafts: the state each row keeps after a verify pass is
the state token-by-token decoding reaches, and greedy output with partly wrong drafts is plain decoding's."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from engine.lockstep.plan import Insert
from engine.speculative import linear
from engine.speculative.rollback import can_verify
from tests.integration.test_speculative_verify import loaded, prompts, run, true_drafts

MODELS = ["qwen3.5", "qwen3-next"]


def _states(cache: list) -> list[tuple[mx.array, mx.array]]:
    return [(c[0], c[1]) for c in cache if isinstance(c, ArraysCache)]


@pytest.mark.parametrize("name", MODELS)
def test_the_state_selected_after_each_rows_last_kept_position_is_the_token_by_token_state(name):
    model, _ = loaded(name)
    prefix = mx.array([[5, 9, 13, 17, 21, 25], [30, 34, 38, 42, 46, 50]])
    fed = mx.array([[7, 11, 15, 19, 23], [8, 12, 16, 20, 24]])  # a verify pass: next input and four drafts per row
    stepped = make_prompt_cache(model)
    model(prefix, cache=stepped)
    after = []  # the states after each of fed's positions, one token at a time as plain decoding feeds them
    for t in range(fed.shape[1]):
        model(fed[:, t:t + 1], cache=stepped)
        after.append(_states(stepped))
    verified = make_prompt_cache(model)
    model(prefix, cache=verified)
    with linear.recording(model, verified) as recorded:
        model(fed, cache=verified)
    last = [1, 4]  # row 0 keeps its input and one draft, row 1 all four drafts
    for c in verified:
        if isinstance(c, ArraysCache):
            recorded.select(c, mx.array(last))
    for layer, (conv, state) in enumerate(_states(verified)):
        for row, at in enumerate(last):
            want_conv, want_state = after[at][layer]
            assert mx.allclose(conv[row], want_conv[row], atol=1e-5)
            assert mx.allclose(state[row], want_state[row], atol=1e-5)


@pytest.mark.parametrize("name", MODELS)
def test_greedy_output_and_kept_states_with_partly_wrong_drafts_are_plain_decodings(name):
    model, _ = loaded(name)
    assert can_verify(model) == (True, "")
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=20 + 3 * i, keep=True, logprobs=True)
               for i, p in enumerate(prompts(3))]
    plain = run(model, set(), inserts)
    wrong = lambda rid, at: (at + int(rid[1:])) % 3 == 0  # noqa: E731  rows reject at different positions
    spec = run(model, set(), inserts, true_drafts(plain["out"], wrong, only={"r0", "r2"}))
    assert spec["out"] == plain["out"] and spec["reasons"] == plain["reasons"]
    assert 0 < spec["accepted"] < spec["proposed"]
    assert spec["steps"] < plain["steps"]
    for rid in plain["out"]:
        cache, fed = spec["ended"][rid]
        plain_cache, plain_fed = plain["ended"][rid]
        assert fed == plain_fed  # the state a prefix cache entry of the sequence would hold
        for (conv, state), (want_conv, want_state) in zip(_states(cache), _states(plain_cache)):
            assert mx.allclose(conv, want_conv, atol=1e-4) and mx.allclose(state, want_state, atol=1e-4)
        for mine, theirs in zip(spec["rows"][rid], plain["rows"][rid]):
            assert mx.allclose(mine, theirs, atol=1e-4)
