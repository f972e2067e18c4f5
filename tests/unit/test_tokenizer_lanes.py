"""Rank 0's tokenizer lanes: a big job holds the one big-job slot, a second big one waits for it, and small
jobs (a count_tokens call, a short prompt) are answered meanwhile."""

from __future__ import annotations

import threading

import anyio
import pytest

from engine.rank0.lanes import BIG_PROMPT_BYTES, TokenizerLanes

BIG, SMALL = BIG_PROMPT_BYTES + 1, 200
WAIT = 10.0  # the bound on every wait; a small job queued behind the held big one would take it all

pytestmark = pytest.mark.anyio


class HeldTokenizer:
    """Work that records each job as it starts; a big one then waits until the test releases it."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self.release = threading.Event()

    def work(self, job: str) -> str:
        self.started.append(job)
        if job.startswith("big"):
            assert self.release.wait(WAIT)
        return job


async def _until(predicate, what: str) -> None:
    with anyio.fail_after(WAIT):
        while not predicate():
            await anyio.sleep(0.01)


async def test_small_jobs_are_answered_while_a_big_one_holds_the_big_job_slot() -> None:
    lanes, tokenizer, done = TokenizerLanes(), HeldTokenizer(), []

    async def run(job: str, size: int) -> None:
        done.append(await lanes.run(tokenizer.work, job, size))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(run, "big prompt", BIG)
            await _until(lambda: tokenizer.started == ["big prompt"], "the big prompt to start")
            tg.start_soon(run, "big tokenize", BIG)
            await _until(lambda: lanes.big.statistics().tasks_waiting == 1, "the second big job to queue")

            with anyio.fail_after(WAIT):  # answered while the big prompt still holds the slot
                await run("small tokenize", SMALL)
                await run("small prompt", SMALL)
            assert done == ["small tokenize", "small prompt"]
            assert "big tokenize" not in tokenizer.started  # big jobs stay one at a time

            tokenizer.release.set()
    finally:
        tokenizer.release.set()  # no worker thread is left waiting, whatever failed
    assert done[2:] == ["big prompt", "big tokenize"]
