"""SPECULATIVE=ngram on two ranks: plans made after the step (with drafts) and plans sent ahead alternate as
requests come and go, the ranks stay in step, and greedy and seeded sampled answers (alone and under load) equal
plain decoding on one rank."""

from __future__ import annotations

import pytest

from tests.harness import Stack
from tests.speculative_runs import greedy_answers

pytestmark = pytest.mark.multirank


def test_ngram_on_two_ranks_equals_plain_decoding_without_desync():
    plain = greedy_answers(1, "off")
    spec = greedy_answers(2, "ngram")  # raises if a rank desynced or the engine died
    assert spec[:2] == plain[:2]
    assert spec[2]["mcs_spec_proposed_tokens_total"] > 0
    assert spec[3]["mode"] == "ngram"
    assert spec[4] == plain[4]  # seeded sampling: the tokens of plain decoding, whatever the drafts and the batch


def test_a_proposer_rank_0_cannot_build_ends_every_rank_with_its_sentence():
    """SPECULATIVE=mtp on a model without multi-token-prediction heads (or a build without the MTP proposer): rank 0
    says why, and the other rank ends with it instead of waiting for a plan."""
    s = Stack()
    try:
        engine = s.start_engine(ranks=2, timeout=120, SPECULATIVE="mtp")
    except RuntimeError as exc:
        log = str(exc)
    else:
        engine.stop()
        pytest.fail("the engine served SPECULATIVE=mtp on demo-tiny, which has no multi-token-prediction heads")
    assert "before serving" in log, log
    assert "rank0 ERROR" in log and "mtp" in log.lower()
    assert "rank1 ERROR" in log and "rank 0 could not build the SPECULATIVE=mtp proposer" in log
