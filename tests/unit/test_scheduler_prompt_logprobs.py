"""Rank 0's scheduler with prompt logprobs (completions with echo and logprobs), without MLX: the echo waits for
the prompt's entries and carries them, first token null; max_tokens 0 answers the prompt alone; such a prompt is
computed whole (the prefix cache holds KV, not logits), and its KV is still kept for the prompts after it."""

from __future__ import annotations

import math

from engine.lockstep.plan import Insert
from engine.lockstep.results import PromptRows, StepResults
from engine.rank0.prefix_index import PrefixIndex
from engine.rank0.prompt_logprobs import ENTRIES_PER_EVENT
from engine.rank0.requests import Counters, Request
from engine.rank0.scheduler import Scheduler
from ipc import Delta, Finish
from ipc.messages import TokenLogprob, TopLogprob
from tests.unit.test_scheduler import EOS, Detok, TextSplitter, extract


class Texts:
    """TokenTexts' shape: token id -> (text, bytes)."""

    def get(self, tid: int) -> tuple[str, list[int]]:
        return f"<{tid}>", list(f"<{tid}>".encode())


def scorer(rid: str, prompt: list[int], *, top: int = 1, max_tokens: int = 4, score_only: bool = False,
           echo: str = "the prompt") -> Request:
    return Request(insert=Insert(rid=rid, tokens=prompt, max_tokens=max_tokens, logprobs=not score_only,
                                 prompt_logprobs=top),
                   outbox=[], prompt_tokens=len(prompt), deadline=math.inf, detok=Detok(), splitter=TextSplitter(),
                   group=rid, top_logprobs=top, texts=Texts(), echo=echo, score_only=score_only)


def admitted(sched: Scheduler, req: Request):
    assert sched.counters.admit(1, capacity=100)
    sched.submit([req])
    return sched.next_plan(fingerprint=0, token_check=0)


def rows(start: int, values: list[float], top: int = 1) -> PromptRows:
    return PromptRows(start, values, [[900 + j] for j in range(len(values))] if top else [],
                      [[v + 0.5] for v in values] if top else [])


def test_the_echo_waits_for_the_prompts_logprobs_and_carries_them_before_the_first_token() -> None:
    sched = Scheduler(8, {EOS}, Counters(), extract)
    admitted(sched, scorer("a", [11, 12, 13, 14]))
    assert [m for _, m in sched.take_events()] == []  # the client hears of it once the inserting step ran
    # two prefill steps: positions 0-1 predict tokens 12, 13; position 2 predicts 14 (the last, fed by decoding)
    sched.absorb(StepResults(reused={"a": 0}, prompt_rows={"a": [rows(0, [-1.0, -2.0])]}))
    (joined,) = [m for _, m in sched.take_events()]
    assert joined.text == "" and joined.logprobs == []  # not the echo yet: its logprobs are not known
    sched.absorb(StepResults(prompt_rows={"a": [rows(2, [-3.0])]}))
    assert [m for _, m in sched.take_events()] == []
    sched.absorb(StepResults(tokens=[("a", 5, None)], logprob_rows={"a": ["row"]}))
    echo, token = [m for _, m in sched.take_events()]
    assert isinstance(echo, Delta) and echo.text == "the prompt" and echo.completion_tokens == 0
    assert [(e.token, e.logprob) for e in echo.logprobs] == [("<11>", None), ("<12>", -1.0), ("<13>", -2.0),
                                                              ("<14>", -3.0)]
    assert echo.logprobs[0].top == [] and echo.logprobs[2].top == [
        TopLogprob(token="<901>", logprob=-1.5, bytes=list(b"<901>"))]
    assert (token.text, token.logprobs) == ("<5>", [TokenLogprob(token="<5>", logprob=-1.0, bytes=[])])


def test_max_tokens_0_answers_the_prompt_alone_and_drops_the_token_sampled_after_it() -> None:
    sched = Scheduler(8, {EOS}, Counters(), extract)
    admitted(sched, scorer("a", [11, 12, 13], max_tokens=1, score_only=True))
    sched.take_events()
    sched.absorb(StepResults(prompt_rows={"a": [rows(0, [-1.0, -2.0])]}))
    sched.absorb(StepResults(tokens=[("a", 5, "length")]))
    echo, finish = [m for _, m in sched.take_events()]
    assert [e.logprob for e in echo.logprobs] == [None, -1.0, -2.0]
    assert isinstance(finish, Finish) and (finish.finish_reason, finish.completion_tokens) == ("length", 0)
    assert (finish.text, finish.logprobs) == ("", [])
    assert not sched.has_work()


def test_a_long_prompts_logprobs_travel_in_several_events() -> None:
    sched = Scheduler(8, {EOS}, Counters(), extract)
    prompt = list(range(100, 100 + 2 * ENTRIES_PER_EVENT + 2))
    admitted(sched, scorer("a", prompt, top=0, max_tokens=1, score_only=True))
    sched.take_events()
    sched.absorb(StepResults(prompt_rows={"a": [rows(0, [-1.0] * (len(prompt) - 1), top=0)]}))
    sched.absorb(StepResults(tokens=[("a", 5, "length")]))
    deltas = [m for _, m in sched.take_events() if isinstance(m, Delta)]
    assert [len(d.logprobs) for d in deltas] == [ENTRIES_PER_EVENT, ENTRIES_PER_EVENT, 2]
    assert [d.text for d in deltas] == ["the prompt", "", ""]
    assert [e.token for d in deltas for e in d.logprobs] == [f"<{t}>" for t in prompt]


def test_a_scored_prompt_reuses_no_entry_yet_its_kv_is_kept_for_the_prompts_after_it() -> None:
    sched = Scheduler(8, {EOS}, Counters(), extract, PrefixIndex(10**9))
    prompt = list(range(100, 400))

    def run(req: Request, answer: list[int]) -> Insert:
        (ins,) = admitted(sched, req).inserts
        for token in answer:
            sched.absorb(StepResults(tokens=[(req.rid, token, "stop" if token == EOS else None)]))
        stored = sched.next_plan(fingerprint=0, token_check=0)
        sched.prefix.applied({i: e.length for i, e in sched.prefix.entries.items()})
        assert stored.stores
        return ins

    plain = scorer("a", prompt, top=-1, echo="")
    run(plain, [50, EOS])
    scored = run(scorer("b", prompt), [51, EOS])
    assert (scored.cache_id, scored.cache_len, scored.keep) == (0, 0, True)
    again = run(scorer("c", prompt + [7], top=-1, echo=""), [52, EOS])
    assert again.cache_len == 300
