"""Rank 0's tokenizer lanes: a big tokenizer job (a frame over BIG_PROMPT_BYTES) holds the one big-job slot,
a second big one waits for it, and small Tokenize/Detokenize calls are answered meanwhile."""

from __future__ import annotations

import queue
import tempfile
import threading
import time
from pathlib import Path

import pytest

from config import load_settings
from engine.rank0 import validate
from engine.rank0.errors import Refused
from engine.rank0.scheduler import Counters
from engine.rank0.server import BIG_PROMPT_BYTES, EngineServer
from ipc import Detokenize, Detokenized, Error, Generate, Info, SamplingParams, Tokenize, Tokenized
from tests.wire import Session, run

BIG = "x" * (BIG_PROMPT_BYTES + 1)
WAIT = 10.0  # the bound on every wait; a small call answered only once the big job ends would take it all


class HeldPrompter:
    """A Prompter whose work on a big text waits until the test releases it; it records what it started."""

    def __init__(self) -> None:
        self.limits = validate.Limits(vocab_size=1000, logits_size=1000, context_length=4096, max_batch=4,
                                      max_queue=4)
        self.context_length = self.limits.context_length
        self.release = threading.Event()
        self.started: list[str] = []  # the kind of each big job, as it starts
        self.big_started = threading.Event()

    def _work(self, kind: str, text: str) -> None:
        if len(text) > BIG_PROMPT_BYTES:
            self.started.append(kind)
            self.big_started.set()
            assert self.release.wait(WAIT)

    def tokens(self, gen: Generate) -> list[int]:
        self._work("generate", str(gen.prompt))
        raise Refused("this test admits nothing", "prompt")

    def tokenize(self, msg: Tokenize) -> Tokenized:
        self._work("tokenize", msg.prompt)
        return Tokenized(tokens=[1, 2, 3], max_model_len=self.context_length)

    def detokenize(self, msg: Detokenize) -> Detokenized:
        return Detokenized(prompt="abc")


@pytest.fixture
def served():
    folder = Path(tempfile.mkdtemp(dir="/tmp", prefix="mcs-"))
    settings = load_settings({"MODEL": "test-model", "SOCKET_PATH": str(folder / "e.sock")}, env_file=folder / "no.env")
    prompter = HeldPrompter()
    info = Info(model="test-model", model_path="/m", context_length=4096, ranks=1, backend="ring", created=0,
                engine_pid=1)
    server = EngineServer(settings, prompter, Counters(), queue.SimpleQueue(), lambda: info)  # type: ignore[arg-type]
    server.start()
    try:
        yield server, prompter, settings.socket_path
    finally:
        prompter.release.set()
        server.stop()


def _wait(predicate, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_small_tokenizer_calls_are_answered_while_a_big_prompt_holds_the_big_job_slot(served):
    server, prompter, path = served
    with Session(path, WAIT) as big_generate, Session(path, WAIT) as big_tokenize:
        big_generate.send(Generate(request_id="big", kind="completion", prompt=BIG, params=SamplingParams(max_tokens=1)))
        assert prompter.big_started.wait(WAIT)
        # A second big job waits for the slot...
        big_tokenize.send(Tokenize(kind="completion", prompt=BIG))
        _wait(lambda: server._big_lane.statistics().tasks_waiting == 1, "the second big job to wait for the slot")

        # ...while small ones are answered beside the big job, which still holds the slot.
        small = run(path, Tokenize(kind="completion", prompt="hi"), timeout=WAIT)
        assert small and isinstance(small[0], Tokenized), small
        small = run(path, Detokenize(tokens=[1, 2]), timeout=WAIT)
        assert small and isinstance(small[0], Detokenized), small
        assert prompter.started == ["generate"]

        prompter.release.set()
        assert isinstance(big_generate.recv(), Error)
        assert isinstance(big_tokenize.recv(), Tokenized)
    assert prompter.started == ["generate", "tokenize"]
