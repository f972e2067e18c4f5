"""Anthropic's stream: message_start, ping, content blocks, message_delta, message_stop (no [DONE])."""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator

from api.access import AccessRecord, escape
from api.anthropic.protocol import Message, Usage
from api.anthropic.render import BlockWriter, error_event, named_event, stop_reason, stop_sequence
from api.engine_client import Generation
from api.errors import APIError
from api.generation import Choice, Renderer, next_event_or_idle

logger = logging.getLogger(__name__)

# a ping after this long without an event (a long prefill), so idle timeouts of proxies and clients keep off
PING_SECONDS = 10.0


async def message_stream(gen: Generation, n: int, renderer: Renderer,
                         record: AccessRecord) -> AsyncGenerator[bytes, None]:
    """The events of one admitted generation; an error after the headers is an `event: error`.

    message_start waits for the engine's first event (sent as the request joins the batch, before its
    prefill), which says how much of the prompt the prefix cache holds: its usage is then the final one.
    A request queued behind a full batch gets pings meanwhile (Anthropic's SDKs skip pings wherever they come)."""
    started = False
    choice = Choice(0)
    blocks = BlockWriter()
    try:
        while choice.finish_reason is None:
            ev = await next_event_or_idle(gen, PING_SECONDS)
            if not started and ev is not None:
                started = True
                yield _message_start(gen, renderer)
                yield named_event("ping", {"type": "ping"})
            if ev is None:
                yield named_event("ping", {"type": "ping"})
                continue
            for frame in blocks.add(ev):
                yield frame
            choice.add(ev)
        for frame in blocks.finish():
            yield frame
        delta = {"type": "message_delta",
                 "delta": {"stop_reason": stop_reason(choice), "stop_sequence": stop_sequence(choice)},
                 "usage": {"input_tokens": gen.prompt_tokens - gen.cached_tokens, "output_tokens": gen.completion_tokens,
                           "cache_read_input_tokens": gen.cached_tokens}}
        yield named_event("message_delta", delta)
        yield named_event("message_stop", {"type": "message_stop"})
    except APIError as exc:
        if not started:  # the error event still follows a message_start, as clients expect
            yield _message_start(gen, renderer)
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, escape(exc.message))
        yield error_event(exc)


def _message_start(gen: Generation, renderer: Renderer) -> bytes:
    """Anthropic's usage counts the prompt's uncached tokens as input_tokens, the prefix cache's as cache reads."""
    usage = Usage(input_tokens=gen.prompt_tokens - gen.cached_tokens, output_tokens=0,
                  cache_read_input_tokens=gen.cached_tokens)
    start = Message(id=renderer.request_id, model=renderer.model, content=[], usage=usage)
    return named_event("message_start", {"type": "message_start", "message": start})
