"""Run one admitted generation for an HTTP request: a JSON body, or an SSE stream of chunks.

The engine's Started decides the HTTP status: admission errors (400, 429, 503) are real
statuses for streaming requests too. Every path closes the engine connection, which is how
the engine learns that a request was abandoned.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TypeVar

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import AccessRecord, access_record
from api.engine_client import EngineClient, Generation
from api.errors import APIError
from api.schemas import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    Usage,
    encode,
)
from api.sse import DONE, EventStreamResponse, error_event, event

logger = logging.getLogger(__name__)

T = TypeVar("T")

# nginx's "client closed request": logged, never seen by the client that left
CLIENT_CLOSED = 499


class Shape:
    """How one endpoint spells its response body and its stream chunks."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self.request_id, self.model, self.created = request_id, model, int(time.time())
        self.include_usage = include_usage
        # with include_usage every chunk carries "usage": null until the last one
        self.chunk_usage: None | msgspec.UnsetType = None if include_usage else msgspec.UNSET

    def first(self) -> msgspec.Struct | None:
        return None

    def text(self, text: str) -> msgspec.Struct:
        raise NotImplementedError

    def finish(self, reason: str) -> msgspec.Struct:
        raise NotImplementedError

    def usage(self, usage: Usage) -> msgspec.Struct:
        raise NotImplementedError

    def response(self, text: str, reason: str, usage: Usage) -> msgspec.Struct:
        raise NotImplementedError


class ChatShape(Shape):
    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None | msgspec.UnsetType) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def first(self) -> ChatCompletionChunk:
        return self._chunk([ChunkChoice(delta=ChunkDelta(role="assistant", content=""))], self.chunk_usage)

    def text(self, text: str) -> ChatCompletionChunk:
        return self._chunk([ChunkChoice(delta=ChunkDelta(content=text))], self.chunk_usage)

    def finish(self, reason: str) -> ChatCompletionChunk:
        return self._chunk([ChunkChoice(delta=ChunkDelta(), finish_reason=reason)], self.chunk_usage)

    def usage(self, usage: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage)

    def response(self, text: str, reason: str, usage: Usage) -> ChatCompletion:
        return ChatCompletion(
            id=self.request_id,
            created=self.created,
            model=self.model,
            choices=[ChatChoice(message=AssistantMessage(content=text), finish_reason=reason)],
            usage=usage,
        )


class CompletionShape(Shape):
    def _body(self, choices: list[CompletionChoice], usage: Usage | None | msgspec.UnsetType) -> Completion:
        return Completion(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def text(self, text: str) -> Completion:
        return self._body([CompletionChoice(text=text)], self.chunk_usage)

    def finish(self, reason: str) -> Completion:
        return self._body([CompletionChoice(text="", finish_reason=reason)], self.chunk_usage)

    def usage(self, usage: Usage) -> Completion:
        return self._body([], usage)

    def response(self, text: str, reason: str, usage: Usage) -> Completion:
        return self._body([CompletionChoice(text=text, finish_reason=reason)], usage)


async def respond(
    request: Request,
    engine: EngineClient,
    msg: ipc.Generate,
    shape: Shape,
    *,
    stream: bool,
    timeout: float,
) -> Response:
    """Start msg on the engine and answer request with a JSON body or an SSE stream."""
    record = access_record(request)
    if stream:
        gen = await until_disconnect(request, lambda: engine.start(msg, timeout))
        if gen is not None:
            record.prompt_tokens = gen.prompt_tokens
            return EventStreamResponse(_stream(gen, shape, record), on_close=lambda: _close(gen, record))
    else:
        body = await until_disconnect(request, lambda: _collect(engine, msg, shape, timeout, record))
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


async def _collect(engine: EngineClient, msg: ipc.Generate, shape: Shape, timeout: float, record: AccessRecord) -> msgspec.Struct:
    gen = await engine.start(msg, timeout)
    record.prompt_tokens = gen.prompt_tokens
    parts: list[str] = []
    try:
        while True:
            ev = await gen.next_event()
            parts.append(ev.text)
            if isinstance(ev, ipc.Finish):
                break
    finally:
        record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
        await gen.aclose()
    logger.debug("%s completion: %r", msg.request_id, "".join(parts))
    return shape.response("".join(parts), ev.finish_reason, _usage(gen))


async def _stream(gen: Generation, shape: Shape, record: AccessRecord) -> AsyncGenerator[bytes, None]:
    try:
        first = shape.first()
        if first is not None:
            yield event(first)
        while True:
            ev = await gen.next_event()
            # Finish.text holds the detokeniser's tail, not yet sent in a Delta
            if ev.text:
                yield event(shape.text(ev.text))
            if isinstance(ev, ipc.Finish):
                break
        yield event(shape.finish(ev.finish_reason))
        if shape.include_usage:
            yield event(shape.usage(_usage(gen)))
    except APIError as exc:
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, exc.message)
        yield error_event(exc)
    yield DONE


async def _close(gen: Generation, record: AccessRecord) -> None:
    record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
    if not gen.done:
        record.outcome = "client_disconnected"
    await gen.aclose()


def _usage(gen: Generation) -> Usage:
    return Usage(
        prompt_tokens=gen.prompt_tokens,
        completion_tokens=gen.completion_tokens,
        total_tokens=gen.prompt_tokens + gen.completion_tokens,
    )
