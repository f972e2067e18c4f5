"""SPECULATIVE=ngram on two ranks across the zoo's cache kinds, tensor parallel and pipelined: greedy answers,
logprobs, a second turn from the prefix cache and concurrent requests equal plain decoding's on the same ranks, no
rank desyncs, linear-attention hybrids included; a sliding-window model decodes plainly with its log line. Then
SPECULATIVE=mtp's heads the same way, tensor parallel and pipelined."""

from __future__ import annotations

import pytest

from tests.speculative_zoo import assert_answers_equal, zoo_answers

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("name, settings", [
    # plain KV and MoE verify as the linear-attention and MLA cases do: CI_SLOW=1 runs them
    pytest.param("llama-4bit", {}, marks=pytest.mark.slow),  # plain KV, quantized, tensor parallel
    pytest.param("qwen3-moe", {}, marks=pytest.mark.slow),  # MoE, tensor parallel
    ("deepseek-v3-4bit", {"PARALLEL": "pipeline"}),  # MLA, each rank verifying with its own layers
    ("qwen3.5-4bit", {}),  # linear attention, tensor parallel: each rank records its own shard of the heads
    # sliding window: plain decoding, as on one rank (tests/integration/test_speculative_zoo.py)
    pytest.param("gpt-oss", {}, marks=pytest.mark.slow),
])
def test_ngram_on_two_ranks_answers_as_plain_decoding_on_them(name: str, settings: dict) -> None:
    plain = zoo_answers(name, 2, "off", **settings)
    spec = zoo_answers(name, 2, "ngram", **settings)
    assert_answers_equal(spec, plain)
    if name == "gpt-oss":
        assert spec["mode"] == "off" and "decodes without speculation" in spec["log"]
    else:
        assert spec["mode"] == "ngram" and spec["counters"]["mcs_spec_accepted_tokens_total"] > 0


@pytest.mark.parametrize("name, parallel", [
    # tensor parallel: the heads are sharded as the main layers, their all_sums meet at the end of every step
    pytest.param("deepseek-v3-mtp-trained", "tensor", marks=pytest.mark.slow),  # as Qwen3.5's below, CI_SLOW=1
    # Qwen3.5's heads sharded by mlx-lm's qwen3_5 shard(), its Gated DeltaNet layers too
    ("qwen3.5-mtp-trained", "tensor"),
    # pipeline: the heads sit whole on the last stage (rank 0), beside the final hidden state; rank 1 holds none,
    # and the drafts they chain there travel in the plan. The trained head keeps drafts; GLM's random one proposes
    ("deepseek-v3-mtp-trained", "pipeline"),
    pytest.param("glm4-moe-mtp", "pipeline", marks=pytest.mark.slow),  # as DeepSeek's above, CI_SLOW=1
])
def test_mtp_heads_on_two_ranks_answer_as_plain_decoding(name: str, parallel: str) -> None:
    plain = zoo_answers(name, 2, "off", PARALLEL=parallel)
    spec = zoo_answers(name, 2, "mtp", PARALLEL=parallel)
    assert_answers_equal(spec, plain)
    assert spec["mode"] == "mtp" and spec["counters"]["mcs_spec_proposed_tokens_total"] > 0, spec["counters"]
    if name.endswith("-trained"):
        assert spec["counters"]["mcs_spec_tokens_per_forward"] >= 1.5, spec["counters"]
