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
    """The events of one admitted generation; an error after the headers is an `event: error`."""
    start = Message(id=renderer.request_id, model=renderer.model, content=[],
                    usage=Usage(input_tokens=gen.prompt_tokens, output_tokens=0))
    yield named_event("message_start", {"type": "message_start", "message": start})
    yield named_event("ping", {"type": "ping"})
    choice = Choice(0)
    blocks = BlockWriter()
    try:
        while choice.finish_reason is None:
            ev = await next_event_or_idle(gen, PING_SECONDS)
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
                 # the prefix cache's share of the prompt is known once the engine has generated
                 "usage": {"input_tokens": gen.prompt_tokens - gen.cached_tokens, "output_tokens": gen.completion_tokens,
                           "cache_read_input_tokens": gen.cached_tokens}}
        yield named_event("message_delta", delta)
        yield named_event("message_stop", {"type": "message_stop"})
    except APIError as exc:
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, escape(exc.message))
        yield error_event(exc)
