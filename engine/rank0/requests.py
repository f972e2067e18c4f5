"""What rank 0 tracks of a request (one Request per choice) and the messages its socket thread sends the step
loop, and how a step's logprobs reach them; apart from engine/rank0/scheduler.py, which decides the rest."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from engine.lockstep.plan import Insert
from engine.lockstep.results import StepResults
from engine.rank0.prefix_index import token_bytes
from ipc.messages import TokenLogprob


@dataclass
class Request:
    """One choice of a generation as rank 0 tracks it, from submission to its last event.

    A request with n choices is n of these sharing `group` (the wire's request id) and an outbox.
    """

    insert: Insert
    outbox: Any  # anyio MemoryObjectSendStream, written only on the server's event loop
    prompt_tokens: int
    deadline: float
    detok: Any  # mlx-lm's streaming detokenizer: add_token, finalize, last_segment
    splitter: Any  # engine/rank0/output.py TextSplitter: feed, finish, stop_sequence
    group: str = ""
    index: int = 0
    top_logprobs: int = 0
    texts: Any = None  # engine/rank0/logprobs.py TokenTexts, set when the request asked for logprobs
    echo: str = ""  # completions with echo: the prompt text, sent before the first token
    # completions with echo and logprobs: the prompt's entries so far (the echo waits for them all)
    prompt_logprobs: list[TokenLogprob] = field(default_factory=list)
    # max_tokens 0 (with echo): the prompt alone is the answer; the one token the batch samples is dropped
    score_only: bool = False
    completion_tokens: int = 0
    logprobs: list[TokenLogprob] = field(default_factory=list)  # not yet sent
    done: bool = False
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache
    tenant: str = ""  # Generate.cache_salt: the prefix cache entries this request may reuse and share
    sampled: list[int] = field(default_factory=list)  # every token the batch sampled (kept for the prefix cache)
    _key: bytes | None = None

    @property
    def key(self) -> bytes:
        """The prompt as token_bytes, for prefix comparisons (computed once)."""
        if self._key is None:
            self._key = token_bytes(self.insert.tokens)
        return self._key

    @property
    def rid(self) -> str:
        return self.insert.rid

    @property
    def scores(self) -> bool:
        """Whether it asked for its prompt's logprobs."""
        return self.insert.prompt_logprobs >= 0


@dataclass
class Submit:
    """Socket thread -> step loop: every choice of one request, admitted or refused together."""

    requests: list[Request]


@dataclass
class Withdraw:
    """Socket thread -> step loop: the client of this request (every choice of it) has gone."""

    rid: str


@dataclass
class Counters:
    """Shared with the socket thread: how many sequences wait (admitted, not yet in the batch) and run."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    waiting: int = 0
    active: int = 0

    def admit(self, n: int, capacity: int) -> bool:
        """Socket thread: reserve n sequences if running + waiting stays within capacity."""
        with self.lock:
            if self.waiting + self.active + n > capacity:
                return False
            self.waiting += n
            return True

    def unadmit(self, n: int) -> None:
        """Socket thread: give back a reservation whose client left before its requests were submitted."""
        with self.lock:
            self.waiting -= n


def append_logprobs(running: dict[str, Request], eos: set[int], extract: Any, results: StepResults) -> None:
    """Append this step's logprobs to the requests that asked (the EOS that ends a choice is not text)."""
    rows = results.logprob_rows
    if not rows:
        return
    asks, owners = [], []
    nth: dict[str, int] = {}  # a speculative step gives a request several tokens, each with its row
    for rid, token, finish in results.tokens:
        req = running.get(rid)
        i = nth[rid] = nth.get(rid, -1) + 1
        if rid in rows and req is not None and not req.done and not (finish == "stop" and token in eos):
            asks.append((token, rows[rid][i], req.top_logprobs))
            owners.append(req)
    texts = owners[0].texts if owners else None
    if texts is None:
        return
    for req, entry in zip(owners, extract(texts, asks)):
        req.logprobs.append(entry)
