"""Rank 0's scheduler without MLX: admission order, cancel in every phase, expiry, n > 1, echo, failures.

Each choice's detokenizer and splitter are fakes (a token becomes the text "<id>"), and so is the
logprob extraction the scheduler is given.
"""

from __future__ import annotations

import math

import pytest

from engine.lockstep.plan import Insert
from engine.lockstep.results import StepResults
from engine.rank0.errors import shutting_down
from engine.rank0.piece import Piece
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Delta, Error, Finish
from ipc.messages import TokenLogprob

EOS = 0


class Detok:
    """Streams "<id>" per token, like mlx-lm's detokenizer streams text."""

    def __init__(self) -> None:
        self.pending = ""

    def add_token(self, token: int) -> None:
        self.pending += f"<{token}>"

    def finalize(self) -> None:
        pass

    @property
    def last_segment(self) -> str:
        text, self.pending = self.pending, ""
        return text


class TextSplitter:
    """All text is content; text containing `stop` ends the choice there."""

    def __init__(self, stop: str | None = None) -> None:
        self.stop = stop
        self.stop_sequence: str | None = None

    def feed(self, text: str) -> tuple[Piece, bool]:
        if self.stop is not None and self.stop in text:
            self.stop_sequence = self.stop
            return Piece(content=text.split(self.stop)[0]), True
        return Piece(content=text), False

    def finish(self, reason: str = "stop") -> Piece:
        return Piece()


def extract(texts, asks):
    return [TokenLogprob(token=f"<{tok}>", logprob=-float(k), bytes=[]) for tok, _row, k in asks]


def make(max_batch: int = 8) -> tuple[Scheduler, Counters]:
    counters = Counters()
    return Scheduler(max_batch, {EOS}, counters, extract), counters


def request(rid: str, *, group: str = "", index: int = 0, deadline: float = math.inf, echo: str = "",
            stop: str | None = None, top_logprobs: int = -1, outbox: list | None = None) -> Request:
    return Request(insert=Insert(rid=rid, tokens=[1, 2, 3], max_tokens=8, logprobs=top_logprobs >= 0),
                   outbox=outbox if outbox is not None else [], prompt_tokens=3, deadline=deadline,
                   detok=Detok(), splitter=TextSplitter(stop), group=group or rid, index=index,
                   top_logprobs=max(top_logprobs, 0), texts="texts" if top_logprobs >= 0 else None, echo=echo)


def admit(sched: Scheduler, *reqs: Request) -> None:
    """What the socket thread does: reserve room, then submit."""
    assert sched.counters.admit(len(reqs), capacity=100)
    for r in reqs:
        sched.submit([r])


def plan(sched: Scheduler):
    return sched.next_plan(fingerprint=0, token_check=0, idle=not sched.has_work())


def joined(msg: object) -> bool:
    """The Delta a choice gets as it joins the batch: no token yet (and no text here, with no echo)."""
    return isinstance(msg, Delta) and msg.completion_tokens == 0 and not msg.text


def events(sched: Scheduler) -> list[tuple[object, object]]:
    """The scheduler's events, the join Deltas left out (test_a_choice_joining_the_batch_... covers them)."""
    return [(box, msg) for box, msg in sched.take_events() if not joined(msg)]


def messages(sched: Scheduler) -> list:
    return [msg for _, msg in events(sched)]


def test_requests_join_the_batch_in_arrival_order_never_beyond_max_batch() -> None:
    sched, counters = make(max_batch=2)
    admit(sched, request("a"), request("b"), request("c"))
    assert counters.waiting == 3
    joined = []
    for _ in range(3):
        joined += [i.rid for i in plan(sched).inserts]
        assert len(sched.running) <= 2
    assert joined == ["a", "b"]  # full: c waits
    assert (counters.waiting, counters.active) == (1, 2)
    sched.absorb(StepResults(tokens=[("a", 5, "length"), ("b", 6, None)]))
    assert [i.rid for i in plan(sched).inserts] == ["c"]
    assert (counters.waiting, counters.active) == (0, 2)


def test_one_plan_fills_every_free_slot() -> None:
    sched, _ = make(max_batch=4)
    admit(sched, *(request(r) for r in "abcd"))
    assert [i.rid for i in plan(sched).inserts] == list("abcd")


def test_tokens_stream_as_deltas_and_the_last_one_finishes_the_choice() -> None:
    sched, counters = make()
    admit(sched, request("a"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    sched.absorb(StepResults(tokens=[("a", 6, None)]))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))  # the EOS that ends it is not text
    got = messages(sched)
    assert [type(m) for m in got] == [Delta, Delta, Finish]
    assert [m.text for m in got] == ["<5>", "<6>", ""]
    assert got[-1].finish_reason == "stop" and got[-1].completion_tokens == 3 and got[-1].prompt_tokens == 3
    assert not sched.has_work() and counters.active == 0


def test_a_stop_string_ends_the_choice_and_the_batch_lets_it_go() -> None:
    sched, _ = make()
    admit(sched, request("a", stop="<6>"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    sched.absorb(StepResults(tokens=[("a", 6, None)]))
    got = messages(sched)
    assert isinstance(got[-1], Finish) and got[-1].finish_reason == "stop"
    assert got[-1].stop_sequence == "<6>"  # which stop string it was
    assert plan(sched).removes == ["a"]


def test_an_end_without_a_stop_string_names_none() -> None:
    sched, _ = make()
    admit(sched, request("a", stop="<6>"), request("b", stop="<6>"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", EOS, "stop"), ("b", 5, "length")]))
    assert [(m.finish_reason, m.stop_sequence) for m in messages(sched)] == [("stop", None), ("length", None)]


def test_cancel_while_queued_leaves_the_queue_and_never_reaches_a_plan() -> None:
    sched, counters = make(max_batch=1)
    admit(sched, request("a"), request("b"))
    plan(sched)
    sched.cancel("b")  # its client went away: nobody to tell
    assert counters.waiting == 0 and messages(sched) == []
    sched.absorb(StepResults(tokens=[("a", 5, "length")]))
    nxt = plan(sched)
    assert nxt.inserts == [] and nxt.removes == []


def test_cancel_with_a_reason_tells_the_client() -> None:
    sched, _ = make(max_batch=1)
    admit(sched, request("a"), request("b"))
    plan(sched)
    reason = shutting_down("b", "stopping")
    sched.cancel("b", reason)
    assert messages(sched) == [reason]


def test_cancel_while_prefilling_removes_it_in_the_next_plan() -> None:
    sched, counters = make()
    admit(sched, request("a"))
    plan(sched)  # inserted; no token yet (still prefilling)
    sched.cancel("a")
    assert plan(sched).removes == ["a"]
    assert counters.active == 0 and not sched.has_work() and messages(sched) == []


def test_cancel_while_decoding_drops_tokens_already_on_their_way() -> None:
    sched, _ = make()
    admit(sched, request("a"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    events(sched)
    sched.cancel("a")
    sched.absorb(StepResults(tokens=[("a", 6, None)]))  # the step that ran before the remove
    assert messages(sched) == []
    assert plan(sched).removes == ["a"]


def test_cancel_after_finish_changes_nothing() -> None:
    sched, _ = make()
    admit(sched, request("a"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, "length")]))
    events(sched)
    sched.cancel("a", shutting_down("a", "too late"))
    assert messages(sched) == [] and not sched.has_work()
    assert plan(sched).removes == []


def test_expired_requests_end_with_a_timeout_in_any_phase() -> None:
    sched, counters = make(max_batch=1)
    admit(sched, request("run", deadline=10.0), request("wait", deadline=10.0))
    plan(sched)
    sched.expire(now=5.0)
    assert messages(sched) == []
    sched.expire(now=11.0)
    got = messages(sched)
    assert sorted(m.request_id for m in got) == ["run", "wait"]
    assert all(isinstance(m, Error) and m.status == 504 and m.code == "request_timeout" for m in got)
    assert counters.waiting == 0
    assert plan(sched).removes == ["run"]


def test_n_choices_share_the_request_id_and_finish_each() -> None:
    sched, _ = make()
    out: list = []
    admit(sched, request("g", outbox=out), request("g/1", group="g", index=1, outbox=out))
    assert [i.rid for i in plan(sched).inserts] == ["g", "g/1"]
    sched.absorb(StepResults(tokens=[("g", 5, "length"), ("g/1", 6, None)]))
    sched.absorb(StepResults(tokens=[("g/1", 7, "length")]))
    got = [(type(m).__name__, m.request_id, m.index, m.text) for _, m in events(sched)]
    assert got == [("Finish", "g", 0, "<5>"), ("Delta", "g", 1, "<6>"), ("Finish", "g", 1, "<7>")]


def test_cancelling_a_request_cancels_every_choice() -> None:
    sched, _ = make(max_batch=1)
    admit(sched, request("g"), request("g/1", group="g", index=1))
    plan(sched)
    sched.cancel("g")
    assert plan(sched).removes == ["g"] and not sched.has_work()


def test_a_failed_choice_ends_its_whole_group_with_one_error_and_others_go_on() -> None:
    sched, counters = make()
    group: list = []
    other: list = []
    admit(sched, request("g", outbox=group), request("g/1", group="g", index=1, outbox=group),
          request("x", outbox=other))
    plan(sched)
    sched.absorb(StepResults(tokens=[("g/1", 6, None), ("x", 7, None)], failed={"g": "ValueError: bad"}))
    got = events(sched)
    errors = [m for box, m in got if box is group]
    assert len(errors) == 2 and all(isinstance(m, Error) and m.status == 500 for m in errors)
    assert {m.request_id for m in errors} == {"g"} and "ValueError: bad" in errors[0].message
    assert [m.text for box, m in got if box is other] == ["<7>"]
    nxt = plan(sched)
    assert nxt.removes == ["g/1"]  # the failed choice is already gone from every rank's batch
    assert counters.active == 1


def test_a_grammar_that_gives_out_mid_output_ends_its_request_with_a_400_not_a_500() -> None:
    sched, _ = make()
    out: list = []
    admit(sched, request("g", outbox=out))
    plan(sched)
    reason = "GrammarFailed: the requested format proved too complex to enforce at this point; simplify the schema"
    sched.absorb(StepResults(tokens=[], failed={"g": reason}))
    (error,) = [m for _, m in events(sched)]
    assert isinstance(error, Error) and (error.status, error.code) == (400, "schema_too_complex")
    assert error.message.startswith("the requested format proved too complex")


def test_a_choice_joining_the_batch_is_told_at_once_how_much_of_its_prompt_the_prefix_cache_holds() -> None:
    """A stream reports the cached share of the prompt at its start (Anthropic's message_start): each choice
    gets a Delta after the step that inserted it, before its first token, carrying the prompt tokens reused."""
    sched = Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**9))
    prompt = list(range(100, 400))
    for rid, answer in (("a", [50, EOS]), ("b", [60, EOS])):
        outbox: list = []
        assert sched.counters.admit(1, capacity=100)
        sched.submit([Request(insert=Insert(rid=rid, tokens=prompt + [7], max_tokens=8), outbox=outbox,
                              prompt_tokens=301, deadline=math.inf, detok=Detok(), splitter=TextSplitter(),
                              group=rid)])
        inserted = plan(sched).inserts[0]
        sched.absorb(StepResults(reused={rid: inserted.cache_len}))  # the ranks held the entry looked up
        (first,) = [msg for _, msg in sched.take_events()]
        assert isinstance(first, Delta) and (first.text, first.completion_tokens) == ("", 0)
        for token in answer:
            sched.absorb(StepResults(tokens=[(rid, token, "stop" if token == EOS else None)]))
        (finish,) = [msg for _, msg in sched.take_events() if isinstance(msg, Finish)]
        assert first.cached_tokens == finish.cached_tokens
        stored = plan(sched)
        sched.prefix.applied({i: e.length for i, e in sched.prefix.entries.items()})
        assert stored.stores or rid == "b"
    assert first.cached_tokens == 300  # "b" reused "a"'s prompt but its last token


def test_echo_sends_the_prompt_before_the_first_token() -> None:
    sched, _ = make()
    admit(sched, request("a", echo="Once upon"))
    plan(sched)
    sched.absorb(StepResults(reused={"a": 0}))  # the step that inserted it, before its first token
    assert [(type(m), m.text, m.completion_tokens) for m in messages(sched)] == [(Delta, "Once upon", 0)]


def test_logprobs_come_from_the_extraction_the_scheduler_was_given() -> None:
    sched, _ = make()
    admit(sched, request("a", top_logprobs=2), request("b"))
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, None), ("b", 6, None)], logprob_rows={"a": ["row"]}))
    got = {m.request_id: m.logprobs for m in messages(sched)}
    assert got == {"a": [TokenLogprob(token="<5>", logprob=-2.0, bytes=[])], "b": []}


def test_usage_reports_what_the_step_reused_not_what_the_lookup_promised() -> None:
    """The ranks dropped the entry between rank 0's lookup and the insert (evicted, refused): the prompt was
    computed in full, so neither the client's usage nor the cache's stats may count it as cached."""
    sched = Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**9))
    prompt = list(range(100, 400))
    entry = sched.prefix.add(prompt)
    sched.prefix.applied({entry: 1000})
    outbox: list = []
    assert sched.counters.admit(1, capacity=100)
    sched.submit([Request(insert=Insert(rid="b", tokens=prompt + [7], max_tokens=8), outbox=outbox,
                          prompt_tokens=301, deadline=math.inf, detok=Detok(), splitter=TextSplitter(), group="b")])
    assert plan(sched).inserts[0].cache_len == 300  # the lookup found it
    sched.absorb(StepResults(reused={"b": 0}))  # the step did not
    sched.absorb(StepResults(tokens=[("b", EOS, "stop")]))
    first, finish = [msg for _, msg in sched.take_events()]
    assert isinstance(first, Delta) and isinstance(finish, Finish)
    assert (first.cached_tokens, finish.cached_tokens) == (0, 0)
    stats = sched.prefix.stats
    assert (stats.cached_tokens, stats.hits, stats.misses) == (0, 0, 1)
