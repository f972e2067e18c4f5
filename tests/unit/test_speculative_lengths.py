"""Each sequence's draft length follows its last verdict, so a batch whose drafts are mostly rejected stops
widening every row of its verify pass to NUM_DRAFT_TOKENS."""

from __future__ import annotations

from engine.lockstep.plan import Plan
from engine.speculative.lengths import MAX_REST, REST_AFTER, START_TOKENS, DraftLengths
from engine.speculative.ngram import NgramProposer
from engine.speculative.schedule import DraftSchedule, batch_width


def test_length_grows_while_all_is_accepted_and_shrinks_to_what_was():
    lengths = DraftLengths(cap=16)
    assert lengths.take("a") == START_TOKENS
    seen = []
    for accepted_all in (True, True, True):
        k = lengths.take("a")
        lengths.judged("a", k, k if accepted_all else 0)
        seen.append(lengths.take("a"))
    assert seen == [8, 16, 16]  # doubled, capped at NUM_DRAFT_TOKENS
    lengths.judged("a", 16, 2)  # the third was rejected: one past what was kept
    assert lengths.take("a") == 3


def test_rejections_halve_to_one_then_rest_longer_each_time():
    lengths = DraftLengths(cap=16)
    asked = []
    for _ in range(40):
        k = lengths.take("a")
        asked.append(k)
        lengths.judged("a", k, 0)
    assert asked[:REST_AFTER] == [4, 2, 1]
    rests = "".join("." if k == 0 else "x" for k in asked[REST_AFTER - 1:])
    assert rests.startswith("x.x..x....x" + "." * MAX_REST + "x" + "." * MAX_REST + "x")


def test_an_acceptance_ends_the_rests_and_forget_starts_over():
    lengths = DraftLengths(cap=16)
    for _ in range(REST_AFTER):
        lengths.judged("a", 1, 0)
    assert lengths.take("a") == 0  # resting
    assert lengths.take("a") == 1
    lengths.judged("a", 1, 1)  # kept: no more rests for the next rejection
    assert lengths.take("a") == 2
    lengths.judged("a", 2, 0)
    assert lengths.take("a") == 1
    lengths.forget("a")
    assert lengths.take("a") == START_TOKENS


def plan(**kw) -> Plan:
    return Plan(step=1, fingerprint=0, token_check=0, **kw)


def test_schedule_asks_each_sequence_for_its_own_length():
    schedule = DraftSchedule(NgramProposer(), draft_tokens=16)
    copy = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3 + [1, 2]  # "1 2" is followed by 3..12 1 2 ...
    histories = {"copy": copy, "chat": copy}
    first = schedule.speculate(plan(), True, lambda: histories)
    assert {rid: len(d) for rid, d in first.drafts.items()} == {"copy": 4, "chat": 4}
    # the step kept all of copy's drafts and none of chat's: copy gained 5 tokens, chat 1
    tokens = [("copy", t, None) for t in [2, 3, 4, 5, 6]] + [("chat", 99, None)]
    schedule.judged(first.drafts, tokens, {"copy", "chat"})
    nxt = schedule.speculate(plan(), True, lambda: histories)
    assert {rid: len(d) for rid, d in nxt.drafts.items()} == {"copy": 8, "chat": 2}


def test_a_batch_drafts_only_as_wide_as_its_drafts_fill_half_of():
    schedule = DraftSchedule(NgramProposer(), draft_tokens=16)
    copy = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3 + [1, 2]
    histories = {"copy": copy, **{f"chat{i}": [100 + i, 200 + i, 300 + i] for i in range(7)}}
    # one drafting row of eight would make the other seven compute five positions each for nothing
    assert schedule.speculate(plan(), True, lambda: histories).drafts == {}
    assert batch_width([4, 4, 4, 4], 8) == 4 and batch_width([8, 2, 2, 2], 6) == 3 and batch_width([3], 1) == 3
