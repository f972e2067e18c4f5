"""Ollama's bodies from the engine's Deltas and Finish: one JSON object, or NDJSON lines ending in done.

Ollama reports how long each stage took, in nanoseconds: load_duration is the wait until the
engine admitted the request (the model is always loaded), prompt_eval_duration runs from then to
the first token, eval_duration from there to the end.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncGenerator
from datetime import datetime, timezone
from typing import Any

import msgspec

import ipc
from api.access import AccessRecord, escape
from api.bodies import encode
from api.engine_client import EngineClient, Generation
from api.errors import APIError
from api.generation import Choice, Renderer, next_event
from api.ollama.protocol import (
    AssistantMessage,
    ChatResponse,
    GenerateResponse,
    Logprob,
    TokenLogprob,
    ToolCallOut,
    ToolCallOutFunction,
)
from api.partial_json import partial_object
from ipc.messages import TokenLogprob as EngineLogprob
from ipc.messages import ToolCall

logger = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"


# the engine's names for what an Ollama request calls otherwise (api/spelling.py): sampling sits in options
ENGINE_NAMES = [
    ("max_tokens", "options.num_predict"),
    ("repetition_penalty", "options.repeat_penalty"),
    *((name, f"options.{name}") for name in ("temperature", "top_p", "top_k", "min_p", "stop", "presence_penalty",
                                             "frequency_penalty")),
    ("response_format", "format"),
]
# /api/generate sends a prompt, which the engine renders as a chat
GENERATE_NAMES = [*ENGINE_NAMES, ("messages", "prompt")]


def error_body(err: APIError) -> dict[str, Any]:
    """Ollama's error: {"error": "message"}, the body of an answer and a stream's last line."""
    return {"error": err.message}


def line(obj: Any) -> bytes:
    """One NDJSON line (JSON escapes newlines, so one line)."""
    return encode(obj) + b"\n"


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama's created_at and modified_at."""
    at = datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc)
    return at.isoformat(timespec="microseconds").replace("+00:00", "Z")


def tool_calls(calls: list[ToolCall], first: int = 0) -> list[ToolCallOut]:
    """The engine's calls with their arguments as objects (a closed call's are one: api/engine_client.py ends a
    request whose are not); of a call cut by max_tokens (done_reason "length"), the values written whole so far."""
    return [ToolCallOut(id=call.id, function=ToolCallOutFunction(index=i, name=call.name, arguments=(
        partial_object(call.arguments) if call.partial else json.loads(call.arguments))))
        for i, call in enumerate(calls, first)]


class OllamaRenderer(Renderer):
    """A chat's or a generate's bodies; it also keeps the clock of the request's stages."""

    def __init__(self, request_id: str, model: str, chat: bool) -> None:
        super().__init__(request_id, model, include_usage=False)
        self.chat = chat
        self.received = time.monotonic_ns()
        self.admitted = self.first = self.ended = 0

    def mark(self, ev: ipc.Delta | ipc.Finish | None = None) -> None:
        """Admitted (no event yet), then each event: the first token and the last event time the stages (the
        Delta a request gets as it joins the batch, before its prefill, carries no token)."""
        now = time.monotonic_ns()
        self.admitted = self.admitted or now
        if ev is not None and (ev.completion_tokens or isinstance(ev, ipc.Finish)):
            self.first = self.first or now
            if isinstance(ev, ipc.Finish):
                self.ended = now

    def _body(self, text: str, reasoning: str, calls: list[ToolCallOut], done: bool,
              logprobs: list[EngineLogprob]) -> ChatResponse | GenerateResponse:
        lp = [self._logprob(e) for e in logprobs] if self.logprobs else msgspec.UNSET
        if self.chat:
            message = AssistantMessage(content=text, thinking=reasoning or msgspec.UNSET,
                                       tool_calls=calls or msgspec.UNSET)
            return ChatResponse(model=self.model, created_at=timestamp(), message=message, done=done, logprobs=lp)
        return GenerateResponse(model=self.model, created_at=timestamp(), response=text,
                                thinking=reasoning or msgspec.UNSET, done=done, logprobs=lp)

    def _logprob(self, e: EngineLogprob) -> Logprob:
        top = [TokenLogprob(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in e.top]
        return Logprob(token=e.token, logprob=e.logprob, bytes=e.bytes, top_logprobs=top or msgspec.UNSET)

    def delta(self, choice: Choice, ev: ipc.Delta | ipc.Finish) -> ChatResponse | GenerateResponse | None:
        """The line for ev (before choice has absorbed it), or None when it adds nothing."""
        if not (ev.text or ev.reasoning or ev.tool_calls or (ev.logprobs and self.logprobs)):
            return None
        return self._body(ev.text, ev.reasoning, tool_calls(ev.tool_calls, len(choice.tool_calls)), False,
                          ev.logprobs)

    def last(self, choice: Choice, prompt_tokens: int, completion_tokens: int) -> ChatResponse | GenerateResponse:
        """The done line of a stream: no text, the reason and the counts."""
        body = self._body("", "", [], True, [])
        body.logprobs = msgspec.UNSET
        return self._done(body, choice, prompt_tokens, completion_tokens)

    def response(self, choices: list[Choice], prompt_tokens: int, completion_tokens: int) -> msgspec.Struct:
        choice = choices[0]
        text, calls = "".join(choice.content), tool_calls(choice.tool_calls)
        # a turn of only tool calls has no text (the chat endpoint answers it with content null)
        if calls and not text.strip():
            text = ""
        body = self._body(text, "".join(choice.reasoning), calls, True, choice.logprobs)
        return self._done(body, choice, prompt_tokens, completion_tokens)

    def _done(self, body: ChatResponse | GenerateResponse, choice: Choice, prompt_tokens: int,
              completion_tokens: int) -> ChatResponse | GenerateResponse:
        ended = self.ended or time.monotonic_ns()
        admitted = self.admitted or ended
        first = self.first or ended
        body.done_reason = choice.finish_reason or "stop"
        body.total_duration = ended - self.received
        body.load_duration = admitted - self.received
        body.prompt_eval_count, body.prompt_eval_duration = prompt_tokens, first - admitted
        body.eval_count, body.eval_duration = completion_tokens, ended - first
        return body

    def loaded(self) -> ChatResponse | GenerateResponse:
        """The answer to a load call (no messages, or no prompt): the model is loaded, as it always is."""
        body = self._body("", "", [], True, [])
        body.logprobs, body.done_reason = msgspec.UNSET, "load"
        return body


async def ndjson_stream(gen: Generation, n: int, renderer: Renderer,
                        record: AccessRecord) -> AsyncGenerator[bytes, None]:
    """The lines of one admitted generation; an error after the headers is a last {"error": ...} line."""
    assert isinstance(renderer, OllamaRenderer)
    renderer.mark()
    choice = Choice(0)
    try:
        while choice.finish_reason is None:
            ev = await next_event(gen)
            renderer.mark(ev)
            body = renderer.delta(choice, ev)
            choice.add(ev)
            if body is not None:
                yield line(body)
        yield line(renderer.last(choice, gen.prompt_tokens, gen.completion_tokens))
    except APIError as exc:
        record.outcome = exc.code or exc.type
        logger.warning("%s: stream ended with an error: %s", gen.request_id, escape(exc.message))
        yield line(error_body(exc))


async def collect(engine: EngineClient, msg: ipc.Generate, renderer: OllamaRenderer, timeout: float,
                  record: AccessRecord) -> msgspec.Struct:
    """Run msg to its end and render the one body of stream: false (with the stages' durations)."""
    renderer.logprobs = msg.params.logprobs
    gen = await engine.start(msg, timeout)
    renderer.mark()
    record.prompt_tokens = gen.prompt_tokens
    choice = Choice(0)
    try:
        while choice.finish_reason is None:
            ev = await next_event(gen)
            renderer.mark(ev)
            choice.add(ev)
    finally:
        record.prompt_tokens, record.completion_tokens = gen.prompt_tokens, gen.completion_tokens
        await gen.aclose()
    logger.debug("%s completion: %r", msg.request_id, "".join(choice.content))
    return renderer.response([choice], gen.prompt_tokens, gen.completion_tokens)
