"""SPECULATIVE=ngram through the API on one rank: greedy answers byte-identical to plain decoding, seeded sampled
answers identical to plain decoding's alone and beside other requests, and the proposals counted in /metrics and
/health."""

from __future__ import annotations

from tests.speculative_runs import greedy_answers


def test_ngram_greedy_answers_equal_plain_decoding_and_proposals_are_counted():
    plain = greedy_answers(1, "off")
    spec = greedy_answers(1, "ngram")
    assert spec[:2] == plain[:2]
    assert spec[4] == plain[4] and spec[4][0] == spec[4][2]  # a seed's tokens depend on neither drafts nor batch
    metrics, health = spec[2], spec[3]
    assert metrics["mcs_spec_proposed_tokens_total"] > 0  # the repeated verse gives the lookup matches
    assert metrics["mcs_spec_forward_passes_total"] > 0
    assert metrics["mcs_spec_emitted_tokens_total"] >= metrics["mcs_spec_forward_passes_total"]
    assert metrics["mcs_spec_tokens_per_forward"] >= 1.0
    assert health["mode"] == "ngram" and health["proposed_tokens"] == metrics["mcs_spec_proposed_tokens_total"]
    assert plain[2]["mcs_spec_proposed_tokens_total"] == 0 and plain[3]["mode"] == "off"
