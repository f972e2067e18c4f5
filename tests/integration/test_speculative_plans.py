"""Rank 0's drafting decisions in the step loop, driven without an engine: which sequences get drafts, and how each
plan tells the ranks whether the next one comes after the step (drafted) or is sent ahead of it. Here rather than
in tests/unit because the loop module imports MLX (through the batch and the link probe)."""

from __future__ import annotations

from types import SimpleNamespace

from engine.leader import MAX_PLANS_AHEAD, Leader
from engine.lockstep.plan import Insert, Plan
from engine.speculative.ngram import NgramProposer


class FakeBatch:
    def __init__(self, histories):
        self.histories_now = histories

    def histories(self):
        return {rid: list(h) for rid, h in self.histories_now.items()}


def loop(histories, proposer=None):
    channel = SimpleNamespace(rank=0, size=2)
    watchdog = SimpleNamespace(beat=lambda what: None)
    return Leader(FakeBatch(histories), channel, watchdog, 1.0, proposer=proposer or NgramProposer(),
                  draft_tokens=3)


def plan(**kw) -> Plan:
    return Plan(step=1, fingerprint=0, token_check=0, **kw)


def test_drafts_only_for_decoding_sequences_the_plan_keeps():
    repeating = [5, 6, 7, 8, 9, 5, 6]
    lp = loop({"a": repeating, "b": repeating, "c": [1, 2, 3]})
    out = lp._speculate(plan(removes=["b"]), after=True)
    # b leaves in this plan, c has no match, a copies what followed "5 6"; a prefilling sequence has no history
    assert out.drafts == {"a": [7, 8, 9]}
    assert out.next_after


def test_a_plan_sent_ahead_carries_no_drafts():
    lp = loop({"a": [5, 6, 7, 5, 6]})
    assert lp._speculate(plan(), after=False).drafts == {}


def test_proposals_that_find_nothing_send_plans_ahead_for_longer_each_time():
    lp = loop({"a": [1, 2, 3, 4]})  # never a match
    flags = []
    after = True
    for _ in range(40):
        p = lp._speculate(plan(), after=after)
        flags.append("A" if after else "h")  # this plan: made After the step, or sent aHead
        after = p.next_after
    # 1, 2, 4, 8, 8 plans ahead between rounds of proposals
    assert "".join(flags).startswith("AhAhhAhhhhA" + "h" * MAX_PLANS_AHEAD + "A" + "h" * MAX_PLANS_AHEAD + "A")


def test_a_match_or_a_new_sequence_brings_proposals_back_at_once():
    lp = loop({"a": [1, 2, 3, 4]})
    for _ in range(3):
        lp._speculate(plan(), after=True)
    assert not lp._speculate(plan(), after=True).next_after
    insert = Insert(rid="n", tokens=[1, 2], max_tokens=4)
    assert lp._speculate(plan(inserts=[insert]), after=False).next_after
    lp.batch.histories_now = {"a": [1, 2, 3, 4, 1, 2]}
    out = lp._speculate(plan(), after=True)
    assert out.drafts == {"a": [3, 4, 1]} and out.next_after


def test_the_proposer_forgets_what_a_plan_removes_sent_ahead_or_not():
    proposer = NgramProposer()
    lp = loop({"a": [1, 2, 9, 1, 2], "b": [3, 4, 8, 3, 4]}, proposer)
    lp._speculate(plan(), after=True)
    assert set(proposer.indexes) == {"a", "b"}
    lp._speculate(plan(removes=["a"]), after=False)
    assert set(proposer.indexes) == {"b"}
