"""A conversation's next turn with the same screenshot: the prefix cache holds the image's KV, so the plan that
inserts the turn carries none of its features (they would cross the link to every rank for nothing), while a
turn whose entry the ranks have not yet confirmed, or that reuses less than the image, still carries them. Rank
0's scheduler without MLX, its plans measured as they travel (msgpack)."""

from __future__ import annotations

import math

import msgspec

from engine.lockstep.plan import ImageRows, Insert
from engine.lockstep.results import StepResults
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from engine.vision.ids import FIRST, carried, needed
from tests.unit.test_scheduler import EOS, Detok, TextSplitter, extract

# a 1024 x 1024 screenshot on Mistral Small 3.1: 1,369 image tokens of 5,120 bfloat16 features (about 14 MB)
ROWS, HIDDEN = 1369, 5120
IMAGE = ImageRows(first=FIRST, rows=ROWS, dtype="bfloat16", data=bytes(ROWS * HIDDEN * 2))
PROMPT = list(range(100, 140)) + list(range(FIRST, FIRST + ROWS)) + list(range(200, 230))


def insert_plan(sched: Scheduler, rid: str, tokens: list[int]):
    assert sched.counters.admit(1, capacity=100)
    sched.submit([Request(insert=Insert(rid=rid, tokens=tokens, max_tokens=8, images=[IMAGE]), outbox=[],
                          prompt_tokens=len(tokens), deadline=math.inf, detok=Detok(), splitter=TextSplitter(),
                          group=rid)])
    plan = sched.next_plan(fingerprint=0, token_check=0)
    sched.absorb(StepResults(reused={rid: plan.inserts[0].cache_len}))
    return plan


def finish(sched: Scheduler, rid: str, *, confirm: bool) -> None:
    sched.absorb(StepResults(tokens=[(rid, 50, None), (rid, EOS, "stop")]))
    stored = sched.next_plan(fingerprint=0, token_check=0)
    assert stored.stores
    if confirm:  # the ranks report what they hold after applying the plan
        sched.prefix.applied({i: 10**6 for i in sched.prefix.entries})


def test_the_next_turn_with_the_same_image_sends_no_features():
    sched = Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**12))
    first = insert_plan(sched, "turn-1", PROMPT)
    assert first.inserts[0].images == [IMAGE]
    finish(sched, "turn-1", confirm=True)
    second = insert_plan(sched, "turn-2", PROMPT + [50, 7, 8, 9])
    assert second.inserts[0].cache_len >= len(PROMPT)
    assert second.inserts[0].images == []
    before, after = len(msgspec.msgpack.encode(first)), len(msgspec.msgpack.encode(second))
    assert before > ROWS * HIDDEN * 2 and after < 10_000  # about 14 MB, then the token ids alone (about 7 kB)


def test_an_entry_the_ranks_have_not_confirmed_still_gets_the_features():
    """Stored by the very plan that inserts the next turn, an entry may yet be dropped by the ranks (one that
    cannot be cut): the turn would then compute its whole prompt, image included."""
    sched = Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**12))
    insert_plan(sched, "turn-1", PROMPT)
    finish(sched, "turn-1", confirm=False)
    second = insert_plan(sched, "turn-2", PROMPT + [50, 7, 8, 9])
    assert second.inserts[0].cache_len > 0 and second.inserts[0].images == [IMAGE]


def test_only_images_wholly_before_the_reused_length_are_left_out():
    other = ImageRows(first=FIRST + ROWS, rows=4, dtype="float32", data=bytes(4 * 8 * 4))
    tokens = [1, 2] + list(range(FIRST, FIRST + ROWS)) + [3] + list(range(FIRST + ROWS, FIRST + ROWS + 4)) + [4]
    assert needed([IMAGE, other], tokens, 0) == [IMAGE, other]
    assert needed([IMAGE, other], tokens, 2 + ROWS - 1) == [IMAGE, other]  # its last row is still to compute
    assert needed([IMAGE, other], tokens, 2 + ROWS + 1) == [other]
    assert needed([IMAGE, other], tokens, len(tokens) - 1) == []
    assert carried([IMAGE, other], tokens) and not carried([other], tokens) and carried([], [1, 2, 3])
