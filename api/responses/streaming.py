"""A Responses stream: response.created, response.in_progress, each output item's events, then
response.completed, response.incomplete (max_output_tokens) or response.failed; no [DONE]."""

from __future__ import annotations

import itertools
import logging
from collections.abc import AsyncGenerator

import ipc
from api.access import AccessRecord, escape
from api.bodies import encode
from api.engine_client import EngineClient, Generation
from api.errors import APIError
from api.generation import Renderer, next_event, next_event_or_idle
from api.responses.protocol import Response
from api.responses.render import Event, ItemWriter, ResponseRenderer, error_event, response_error

logger = logging.getLogger(__name__)

# a response.in_progress after this long without an event (a long prefill, a long tool call), so that
# clients timing out on idle streams keep waiting: Codex counts only events, not SSE comments
KEEPALIVE_SECONDS = 10.0


def named_event(event: Event, sequence_number: int) -> bytes:
    """One SSE frame as OpenAI sends it: an `event:` line naming the type, then its data."""
    event["sequence_number"] = sequence_number
    return b"event: " + event["type"].encode() + b"\ndata: " + encode(event) + b"\n\n"


def _terminal(renderer: ResponseRenderer, writer: ItemWriter, finish: ipc.Finish, gen: Generation) -> Response:
    incomplete = finish.finish_reason == "length"
    return renderer.body("incomplete" if incomplete else "completed", writer.output,
                         usage=renderer.usage_of(gen.prompt_tokens, gen.completion_tokens, writer, gen.cached_tokens))


async def response_stream(gen: Generation, n: int, renderer: Renderer,
                          record: AccessRecord) -> AsyncGenerator[bytes, None]:
    """The events of one admitted generation; an error after the headers is an `error` event, then
    response.failed with the items so far."""
    assert isinstance(renderer, ResponseRenderer)
    numbers = itertools.count()
    started = renderer.body("in_progress", [])
    yield named_event({"type": "response.created", "response": started}, next(numbers))
    yield named_event({"type": "response.in_progress", "response": started}, next(numbers))
    writer = renderer.writer()
    try:
        finish: ipc.Finish | None = None
        while finish is None:
            ev = await next_event_or_idle(gen, KEEPALIVE_SECONDS)
            if ev is None:
                yield named_event({"type": "response.in_progress", "response": started}, next(numbers))
                continue
            for event in writer.add(ev):
                yield named_event(event, next(numbers))
            if isinstance(ev, ipc.Finish):
                finish = ev
        for event in writer.finish(finish.finish_reason == "length"):
            yield named_event(event, next(numbers))
        body = _terminal(renderer, writer, finish, gen)
        yield named_event({"type": f"response.{body.status}", "response": body}, next(numbers))
    except APIError as exc:
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, escape(exc.message))
        yield named_event(error_event(exc), next(numbers))
        failed = renderer.body("failed", writer.failed_output(), error=response_error(exc))
        yield named_event({"type": "response.failed", "response": failed}, next(numbers))


async def collect_response(engine: EngineClient, msg: ipc.Generate, renderer: ResponseRenderer, timeout: float,
                           record: AccessRecord) -> Response:
    """The non-streamed answer, written by the same ItemWriter as a stream's events."""
    gen = await engine.start(msg, timeout)
    record.prompt_tokens = gen.prompt_tokens
    writer = renderer.writer()
    try:
        while not isinstance(ev := await next_event(gen), ipc.Finish):
            writer.add(ev)
        writer.add(ev)
    finally:
        record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
        await gen.aclose()
    writer.finish(ev.finish_reason == "length")
    logger.debug("%s completion: %r", msg.request_id, writer.text())
    return _terminal(renderer, writer, ev, gen)
