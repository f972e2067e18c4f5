"""Run one admitted generation for an HTTP request: a JSON body, or an SSE stream of chunks.

The engine's Started decides the HTTP status: admission errors (400, 429, 503) are real
statuses for streaming requests too. Every path closes the engine connection, which is how
the engine learns that a request was abandoned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import AccessRecord, access_record, escape
from api.bodies import encode
from api.engine_client import EngineClient, Generation
from api.errors import APIError, EngineUnavailable
from api.sse import DONE, EventStreamResponse, error_event, event
from ipc.messages import TokenLogprob, ToolCall

logger = logging.getLogger(__name__)

T = TypeVar("T")

# nginx's "client closed request": logged, never seen by the client that left
CLIENT_CLOSED = 499

# The waits of running generations, so a server's drain deadline can end them (end_open_streams).
_open_waits: set[anyio.CancelScope] = set()
_drain_message = ""


def end_open_streams(message: str) -> int:
    """End every running generation now: a stream with an error event then [DONE], a JSON request with 503."""
    global _drain_message
    _drain_message = message
    for scope in _open_waits:
        scope.cancel()
    return len(_open_waits)


async def next_event(gen: Generation) -> ipc.Delta | ipc.Finish:
    """The next event of gen, or the drain's 503 once the server is shutting down."""
    if not _drain_message:  # else the deadline passed while this stream was sending
        with anyio.CancelScope() as scope:
            _open_waits.add(scope)
            try:
                return await gen.next_event()
            finally:
                _open_waits.discard(scope)
    raise EngineUnavailable(_drain_message, code="shutting_down")


async def next_event_or_idle(gen: Generation, idle: float) -> ipc.Delta | ipc.Finish | None:
    """The next event, or None when nothing arrived within idle seconds (time for a keep-alive)."""
    if not _drain_message:
        with anyio.CancelScope() as scope:
            _open_waits.add(scope)
            try:
                if not await gen.readable(idle):
                    return None
            finally:
                _open_waits.discard(scope)
    return await next_event(gen)  # after a drain's cancel this raises its 503


@dataclass
class Choice:
    """One choice as its events arrive: the text so far, its tool calls, logprobs and finish."""

    index: int
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_sequence: str | None = None  # the stop string that ended the choice
    completion_tokens: int = 0
    offset: int = 0  # legacy completions: text_offset of the next token

    def add(self, ev: ipc.Delta | ipc.Finish) -> None:
        self.content.append(ev.text)
        self.reasoning.append(ev.reasoning)
        self.tool_calls.extend(ev.tool_calls)
        self.logprobs.extend(ev.logprobs)
        self.completion_tokens = ev.completion_tokens
        if isinstance(ev, ipc.Finish):
            self.finish_reason, self.stop_sequence = ev.finish_reason, ev.stop_sequence

    @property
    def reason(self) -> str:
        # The engine ends a choice that called tools with "stop"; OpenAI names that "tool_calls".
        reason = self.finish_reason or "stop"
        return "tool_calls" if reason == "stop" and self.tool_calls else reason


class Renderer:
    """How one endpoint spells its response body and its stream chunks (a dialect supplies one)."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.request_id, self.model, self.created = request_id, model, int(time.time())
        self.include_usage = include_usage
        self.logprobs = False  # set by respond() from the request
        self.cached_tokens = 0  # of the prompt, from the prefix cache: set before usage() and response()
        # with include_usage every chunk carries "usage": null until the last one
        self.chunk_usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET

    def first(self, index: int) -> msgspec.Struct | None:
        return None

    def delta(self, choice: Choice, ev: ipc.Delta | ipc.Finish) -> msgspec.Struct | None:
        """The chunk for ev (before choice has absorbed it), or None when it adds nothing."""
        raise NotImplementedError

    def finish(self, index: int, reason: str) -> msgspec.Struct:
        raise NotImplementedError

    def usage(self, prompt_tokens: int, completion_tokens: int) -> msgspec.Struct:
        raise NotImplementedError

    def response(self, choices: list[Choice], prompt_tokens: int, completion_tokens: int) -> msgspec.Struct:
        raise NotImplementedError


# writes a dialect's SSE stream of one admitted generation: (gen, n, renderer, record) -> frames
Streamer = Callable[[Generation, int, "Renderer", AccessRecord], AsyncGenerator[bytes, None]]


async def respond(
    request: Request,
    engine: EngineClient,
    msg: ipc.Generate,
    renderer: Renderer,
    *,
    stream: bool,
    timeout: float,
    streamer: Streamer | None = None,
    media_type: str | None = None,
) -> Response:
    """Start msg on the engine and answer request with a JSON body or an SSE stream (streamer's, if given,
    sent as media_type: Ollama's streams are NDJSON)."""
    record = access_record(request)
    renderer.logprobs = msg.params.logprobs
    if stream:
        gen = await until_disconnect(request, lambda: engine.start(msg, timeout))
        if gen is not None:
            record.prompt_tokens = gen.prompt_tokens
            frames = (streamer or _stream)(gen, msg.params.n, renderer, record)
            return EventStreamResponse(frames, on_close=lambda: _close(gen, record), media_type=media_type)
    else:
        body = await until_disconnect(request, lambda: _collect(engine, msg, renderer, timeout, record))
        if body is not None:
            return Response(encode(body), media_type="application/json")
    record.outcome = "client_disconnected"
    return Response(status_code=CLIENT_CLOSED)


async def until_disconnect(request: Request, fn: Callable[[], Awaitable[T]]) -> T | None:
    """Await fn(), cancelling it (and returning None) if the client disconnects first.

    Call only after the body has been read: receive() then waits for the disconnect.
    """
    result: T | None = None
    error: APIError | None = None
    async with anyio.create_task_group() as tg:

        async def watch() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            result = await fn()
        except APIError as exc:
            error = exc  # raised below, not wrapped in the task group's ExceptionGroup
        tg.cancel_scope.cancel()
    if error is not None:
        raise error
    return result


async def _collect(engine: EngineClient, msg: ipc.Generate, renderer: Renderer, timeout: float, record: AccessRecord) -> msgspec.Struct:
    gen = await engine.start(msg, timeout)
    record.prompt_tokens = gen.prompt_tokens
    choices = [Choice(i) for i in range(msg.params.n)]
    try:
        remaining = len(choices)
        while remaining:
            ev = await next_event(gen)
            choices[ev.index].add(ev)
            remaining -= isinstance(ev, ipc.Finish)
    finally:
        _count(gen, choices)
        record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
        await gen.aclose()
    logger.debug("%s completion: %r", msg.request_id, ["".join(c.content) for c in choices])
    renderer.cached_tokens = gen.cached_tokens
    return renderer.response(choices, gen.prompt_tokens, gen.completion_tokens)


async def _stream(gen: Generation, n: int, renderer: Renderer, record: AccessRecord) -> AsyncGenerator[bytes, None]:
    """The SSE body. Events that arrived together go out in one write: a client reading slower than tokens
    come gets fewer, larger writes instead of one per token."""
    choices = [Choice(i) for i in range(n)]
    out: list[bytes] = []
    try:
        for i in range(n):
            first = renderer.first(i)
            if first is not None:
                out.append(event(first))
        if out:
            yield b"".join(out)
            out = []
        remaining = n
        while remaining:
            ev = await next_event(gen)
            choice = choices[ev.index]
            # Finish carries the choice's last text (the detokeniser's tail), sent before its finish chunk
            chunk = renderer.delta(choice, ev)
            choice.add(ev)
            if chunk is not None:
                out.append(event(chunk))
            if isinstance(ev, ipc.Finish):
                remaining -= 1
                out.append(event(renderer.finish(ev.index, choice.reason)))
            if out and (not remaining or not gen.has_event()):
                yield b"".join(out)
                out = []
        _count(gen, choices)
        renderer.cached_tokens = gen.cached_tokens
        if renderer.include_usage:
            yield event(renderer.usage(gen.prompt_tokens, gen.completion_tokens))
    except APIError as exc:
        if out:
            yield b"".join(out)
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, escape(exc.message))
        yield error_event(exc)
    yield DONE


def _count(gen: Generation, choices: list[Choice]) -> None:
    """Usage counts the prompt once and the tokens of every choice (OpenAI's rule for n > 1)."""
    gen.completion_tokens = sum(c.completion_tokens for c in choices)


async def _close(gen: Generation, record: AccessRecord) -> None:
    record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
    if not gen.done:
        record.outcome = "client_disconnected"
    await gen.aclose()
