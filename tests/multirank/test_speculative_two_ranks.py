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


def refused(**settings) -> str:
    """The log of a two-rank engine that must end before serving with these settings."""
    s = Stack()
    try:
        engine = s.start_engine(ranks=2, timeout=120, **settings)
    except RuntimeError as exc:
        return str(exc)
    engine.stop()
    pytest.fail(f"the engine served with {settings}")


def test_a_proposer_rank_0_cannot_build_ends_every_rank_with_its_sentence():
    """A draft model rank 0 cannot load (only rank 0 holds it): rank 0 says why, and the other rank ends with it
    instead of waiting for a plan."""
    log = refused(SPECULATIVE="draft", DRAFT_MODEL="/nonexistent/draft")
    assert "before serving" in log, log
    assert "rank0 ERROR" in log and "DRAFT_MODEL='/nonexistent/draft'" in log, log
    assert "rank1 ERROR" in log and "rank 0 could not build the SPECULATIVE=draft proposer" in log, log


def test_mtp_without_heads_ends_every_rank_with_the_sentence_why():
    """SPECULATIVE=mtp on demo-tiny, which has no multi-token-prediction heads: every rank loads the heads beside its
    shard, so each one ends with the sentence itself."""
    log = refused(SPECULATIVE="mtp")
    assert "before serving" in log, log
    for rank in (0, 1):
        assert f"rank{rank} ERROR engine: SPECULATIVE=mtp cannot run on MODEL=" in log, log
