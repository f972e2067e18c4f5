"""SPECULATIVE=ngram on two ranks: plans made after the step (with drafts) and plans sent ahead alternate as
requests come and go, the ranks stay in step, and greedy answers equal plain decoding on one rank."""

from __future__ import annotations

import pytest

from tests.speculative_runs import greedy_answers

pytestmark = pytest.mark.multirank


def test_ngram_on_two_ranks_equals_plain_decoding_without_desync():
    plain = greedy_answers(1, "off")
    spec = greedy_answers(2, "ngram")  # raises if a rank desynced or the engine died
    assert spec[:2] == plain[:2]
    assert spec[2]["mcs_spec_proposed_tokens_total"] > 0
    assert spec[3]["mode"] == "ngram"
