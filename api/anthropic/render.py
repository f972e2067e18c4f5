"""Anthropic's message body, and its stream of named events, from the engine's Deltas and Finish."""

from __future__ import annotations

import json
from typing import Any

import ipc
from ipc.messages import ToolCall
from api.anthropic.errors import error_body
from api.anthropic.protocol import Message, OutputBlock, TextBlock, ThinkingBlock, ToolUseBlock, Usage
from api.bodies import encode
from api.errors import APIError
from api.generation import Choice, Renderer
from api.partial_json import partial_object


def named_event(name: str, data: Any) -> bytes:
    """One SSE frame as Anthropic sends it: an `event:` line naming the type, then its data."""
    return b"event: " + name.encode() + b"\ndata: " + encode(data) + b"\n\n"


def error_event(exc: APIError) -> bytes:
    return named_event("error", error_body(exc))


def tool_use_id(call: ToolCall) -> str:
    """Anthropic's toolu_ spelling of the engine's call id (the client sends it back in tool_result)."""
    return call.id if call.id.startswith("toolu_") else "toolu_" + call.id.removeprefix("call_")


def tool_input(call: ToolCall) -> dict[str, Any]:
    """The call's arguments as the object Anthropic's input is (a closed call's are one: api/engine_client.py
    ends a request whose are not); of a call cut by max_tokens, the values written whole so far."""
    return partial_object(call.arguments) if call.partial else json.loads(call.arguments)


def stop_reason(choice: Choice) -> str:
    # a call cut by max_tokens is not one to run: max_tokens, with its partial tool_use block
    if choice.tool_calls and not any(c.partial for c in choice.tool_calls):
        return "tool_use"
    if choice.stop_sequence is not None:
        return "stop_sequence"
    return "max_tokens" if choice.finish_reason == "length" else "end_turn"


def stop_sequence(choice: Choice) -> str | None:
    """The stop sequence that ended the message, when stop_reason says one did."""
    return choice.stop_sequence if stop_reason(choice) == "stop_sequence" else None


class MessageRenderer(Renderer):
    """The non-streaming body; streams are written by api/anthropic/streaming.py."""

    def response(self, choices: list[Choice], prompt_tokens: int, completion_tokens: int) -> Message:
        choice = choices[0]
        blocks: list[OutputBlock] = []
        reasoning = "".join(choice.reasoning)
        if reasoning:
            blocks.append(ThinkingBlock(thinking=reasoning))
        text = "".join(choice.content)
        # a turn of only tool calls has no text block (the chat endpoint answers it with content null)
        if text and not (choice.tool_calls and not text.strip()):
            blocks.append(TextBlock(text=text))
        blocks += [ToolUseBlock(id=tool_use_id(c), name=c.name, input=tool_input(c)) for c in choice.tool_calls]
        return Message(id=self.request_id, model=self.model, content=blocks, stop_reason=stop_reason(choice),
                       stop_sequence=stop_sequence(choice),
                       usage=Usage(input_tokens=prompt_tokens - self.cached_tokens, output_tokens=completion_tokens,
                                   cache_read_input_tokens=self.cached_tokens))


class BlockWriter:
    """Turns engine events into content_block_start/delta/stop events, one open block at a time."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None  # the type of the open block
        # whitespace that would open a text block, held until text follows: before a tool call it is
        # dropped, as in the non-streamed message
        self.pending = ""

    def _switch(self, kind: str, start: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index += 1
        self.open = kind
        out.append(named_event("content_block_start",
                               {"type": "content_block_start", "index": self.index, "content_block": start}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return named_event("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def finish(self) -> list[bytes]:
        """The held whitespace (nothing else came), then the last block's stop."""
        out = self._text("", hold=False) if self.pending else []
        return out + self.close()

    def _text(self, text: str, hold: bool = True) -> list[bytes]:
        out: list[bytes] = []
        if self.open != "text":
            if hold and not text.strip():
                self.pending += text
                return out
            text, self.pending = self.pending + text, ""
            out += self._switch("text", {"type": "text", "text": ""})
        out.append(self._delta({"type": "text_delta", "text": text}))
        return out

    def close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [named_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def add(self, ev: ipc.Delta | ipc.Finish) -> list[bytes]:
        out: list[bytes] = []
        if ev.reasoning:
            if self.open != "thinking":
                out += self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            out.append(self._delta({"type": "thinking_delta", "thinking": ev.reasoning}))
        if ev.text:
            out += self._text(ev.text)
        for call in ev.tool_calls:
            self.pending = ""
            # each call arrives whole: one input_json_delta carries all of its input (of a call cut by
            # max_tokens, the JSON text written so far, as Anthropic streams a cut call)
            out += self._switch("tool_use", {"type": "tool_use", "id": tool_use_id(call), "name": call.name,
                                             "input": {}})
            partial_json = call.arguments if call.partial else json.dumps(tool_input(call))
            if partial_json:
                out.append(self._delta({"type": "input_json_delta", "partial_json": partial_json}))
        return out
