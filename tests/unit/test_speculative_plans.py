"""Rank 0's drafting decisions, driven without an engine: which sequences get drafts, and how each plan tells the
ranks whether the next one comes after the step (drafted) or is sent ahead of it."""

from __future__ import annotations

from engine.lockstep.plan import Insert, Plan
from engine.speculative.ngram import NgramProposer
from engine.speculative.schedule import MAX_PLANS_AHEAD, DraftSchedule


class Batch:
    """What the schedule asks of the batch: its decoding sequences' histories."""

    def __init__(self, histories):
        self.histories_now = histories

    def histories(self):
        return {rid: list(h) for rid, h in self.histories_now.items()}


class Loop:
    """The leader's call, as engine/leader.py makes it."""

    def __init__(self, histories, proposer=None):
        self.batch = Batch(histories)
        self.schedule = DraftSchedule(proposer or NgramProposer(), draft_tokens=3)

    def speculate(self, plan: Plan, after: bool) -> Plan:
        return self.schedule.speculate(plan, after, self.batch.histories)


def plan(**kw) -> Plan:
    return Plan(step=1, fingerprint=0, token_check=0, **kw)


def test_drafts_only_for_decoding_sequences_the_plan_keeps():
    repeating = [5, 6, 7, 8, 9, 5, 6]
    lp = Loop({"a": repeating, "b": repeating, "c": [1, 2, 3]})
    out = lp.speculate(plan(removes=["b"]), after=True)
    # b leaves in this plan, c has no match, a copies what followed "5 6"; a prefilling sequence has no history
    assert out.drafts == {"a": [7, 8, 9]}
    assert out.next_after


def test_a_plan_sent_ahead_carries_no_drafts():
    lp = Loop({"a": [5, 6, 7, 5, 6]})
    assert lp.speculate(plan(), after=False).drafts == {}


def test_proposals_that_find_nothing_send_plans_ahead_for_longer_each_time():
    lp = Loop({"a": [1, 2, 3, 4]})  # never a match
    flags = []
    after = True
    for _ in range(40):
        p = lp.speculate(plan(), after=after)
        flags.append("A" if after else "h")  # this plan: made After the step, or sent aHead
        after = p.next_after
    # 1, 2, 4, 8, 8 plans ahead between rounds of proposals
    assert "".join(flags).startswith("AhAhhAhhhhA" + "h" * MAX_PLANS_AHEAD + "A" + "h" * MAX_PLANS_AHEAD + "A")


def test_a_match_or_a_new_sequence_brings_proposals_back_at_once():
    lp = Loop({"a": [1, 2, 3, 4]})
    for _ in range(3):
        lp.speculate(plan(), after=True)
    assert not lp.speculate(plan(), after=True).next_after
    insert = Insert(rid="n", tokens=[1, 2], max_tokens=4)
    assert lp.speculate(plan(inserts=[insert]), after=False).next_after
    lp.batch.histories_now = {"a": [1, 2, 3, 4, 1, 2]}
    out = lp.speculate(plan(), after=True)
    assert out.drafts == {"a": [3, 4, 1]} and out.next_after


def test_the_proposer_forgets_what_a_plan_removes_sent_ahead_or_not():
    proposer = NgramProposer()
    lp = Loop({"a": [1, 2, 9, 1, 2], "b": [3, 4, 8, 3, 4]}, proposer)
    lp.speculate(plan(), after=True)
    assert set(proposer.indexes) == {"a", "b"}
    lp.speculate(plan(removes=["a"]), after=False)
    assert set(proposer.indexes) == {"b"}


def test_the_heads_chain_only_after_a_step_whose_next_plan_can_draft():
    # SPECULATIVE=mtp's heads run after a step for the next plan's drafts: not when that plan is sent ahead (no
    # drafts), nor when every sequence will be within a token of max_tokens (drafts are cut there)
    lp = Loop({"a": [1, 2, 3, 4]})  # never a match: the next plan goes ahead
    dry = lp.speculate(plan(), after=True)
    assert not dry.next_after and not dry.chain
    lp.batch.histories_now = {"a": [1, 2, 3, 4, 1, 2]}
    drafting = lp.schedule.speculate(plan(), True, lp.batch.histories, lambda: {"a": 9})
    assert drafting.drafts and drafting.next_after and drafting.chain
    for left, removes, chain in [({"a": 2}, [], False), ({"a": 2, "b": 3}, [], True), ({"a": 2, "b": 3}, ["b"], False)]:
        lp.batch.histories_now = {"a": [1, 2, 3, 4, 1, 2]}
        out = lp.schedule.speculate(plan(removes=removes), True, lp.batch.histories, lambda: left)
        assert out.next_after and out.chain is chain, (left, removes)
