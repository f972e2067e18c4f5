"""SPECULATIVE=ngram through the API on one rank, across the zoo's cache kinds: greedy answers, logprobs, a second
turn from the prefix cache and concurrent requests equal plain decoding's, linear-attention hybrids included;
sliding-window models decode plainly with one log line saying why."""

from __future__ import annotations

import pytest

from tests.speculative_zoo import assert_answers_equal, zoo_answers

# plain KV; MLA's latent (4-bit: the tiny bf16 one never repeats itself, so nothing would be proposed); MoE;
# 4-bit weights; linear attention beside full attention (Qwen3.5 4-bit, as its bf16 one never repeats itself;
# Qwen3-Next with experts). Then a sliding window, which decodes plainly. Qwen3's plain KV takes Llama's path and
# Qwen3-Next's linear attention Qwen3.5's: CI_SLOW=1 runs them.
VERIFYING = [pytest.param("qwen3", marks=pytest.mark.slow), "deepseek-v3-4bit", "qwen3-moe", "llama-4bit",
             "qwen3.5-4bit", pytest.param("qwen3-next", marks=pytest.mark.slow)]
FALLBACK = ["gpt-oss"]


@pytest.mark.parametrize("name", VERIFYING + FALLBACK)
def test_ngram_answers_equal_plain_decoding_on_every_cache_kind(name: str) -> None:
    plain = zoo_answers(name, 1, "off")
    spec = zoo_answers(name, 1, "ngram")
    assert_answers_equal(spec, plain)
    if name not in FALLBACK:
        assert spec["mode"] == "ngram"
        assert spec["counters"]["mcs_spec_accepted_tokens_total"] > 0  # the repeated text was proposed and kept
    else:
        assert spec["mode"] == "off" and "decodes without speculation" in spec["log"]
        assert spec["counters"]["mcs_spec_proposed_tokens_total"] == 0


def test_a_draft_model_equal_to_the_target_answers_as_plain_decoding_with_every_proposal_accepted() -> None:
    plain = zoo_answers("llama", 1, "off")
    spec = zoo_answers("llama", 1, "draft", DRAFT_MODEL="zoo-llama")
    assert spec["texts"] == plain["texts"] and spec["tokens"] == plain["tokens"]
    assert spec["mode"] == "draft" and "ERROR" not in spec["log"], spec["log"][-3000:]
    proposed, accepted = (spec["counters"][f"mcs_spec_{k}_tokens_total"] for k in ("proposed", "accepted"))
    assert proposed > 0 and accepted == proposed


@pytest.mark.parametrize("name", ["deepseek-v3-mtp-trained", "glm4-moe-mtp", "qwen3.5-mtp-trained",
                                  # linear attention as Qwen3.5's, with random heads: CI_SLOW=1 runs it
                                  pytest.param("qwen3-next-mtp", marks=pytest.mark.slow)])
def test_mtp_heads_answer_as_plain_decoding_and_really_propose(name: str) -> None:
    # GLM's and Qwen3-Next's zoo heads are random: their drafts are proposed and (nearly) all rejected; DeepSeek's
    # and Qwen3.5's were trained on the main model's own greedy continuations (engine/zoo/mtp_train.py), so they
    # are accepted too (Qwen3.5's linear-attention states kept at each row's own last accepted token)
    plain = zoo_answers(name, 1, "off")
    spec = zoo_answers(name, 1, "mtp")
    assert_answers_equal(spec, plain)
    assert spec["mode"] == "mtp" and spec["counters"]["mcs_spec_proposed_tokens_total"] > 0
    if name.endswith("-trained"):
        assert spec["counters"]["mcs_spec_tokens_per_forward"] >= 1.5, spec["counters"]


def test_mtp_heads_with_quantized_kv_answer_as_plain_decoding_under_the_same_kv_bits() -> None:
    # KV_BITS stores the heads' KV as the main layers' (MLA's latent: the zoo's wide one, which groups of 64 fit)
    plain = zoo_answers("deepseek-v3-wide-mtp-trained", 1, "off", KV_BITS="8")
    spec = zoo_answers("deepseek-v3-wide-mtp-trained", 1, "mtp", KV_BITS="8")
    assert_answers_equal(spec, plain)
    assert spec["mode"] == "mtp" and spec["counters"]["mcs_spec_tokens_per_forward"] >= 1.5, spec["counters"]
