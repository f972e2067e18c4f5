"""The response object, its output items, and the stream events that build them, from the engine's events.

One ItemWriter turns the engine's Deltas and Finish into output items in the order they arrive, with
the events that add, fill and finish each; a non-streamed answer is written by the same writer, so
both ways give the same items.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from msgspec import UNSET

import ipc
from api.errors import APIError
from api.generation import Renderer
from api.responses.protocol import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    ItemStatus,
    LogProb,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningEcho,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseError,
    ResponsesRequest,
    ResponseStatus,
    ResponseUsage,
    TextConfig,
    TextFormat,
    TopLogProb,
)
from api.responses.serving import ToolSet
from ipc.messages import ToolCall, TokenLogprob

Event = dict[str, Any]


class ItemWriter:
    """Output items from engine events: a reasoning item for thinking, a message for text, a function_call
    per tool call, each opened when its first piece arrives and finished when another kind follows."""

    def __init__(self, origin: dict[str, tuple[str | None, str]], logprobs: bool) -> None:
        self.origin = origin  # prompt name -> (namespace, name), to name calls as the client knows them
        self.logprobs = logprobs
        self.output: list[OutputItem] = []  # finished items; the open one comes next
        self.calls = 0
        self.reasoning_tokens = 0
        self._kind: str | None = None  # "reasoning" or "message" while one is open
        self._id = ""
        self._text: list[str] = []
        self._logprobs: list[LogProb] = []
        # whitespace that would open a message, held until text follows: before a tool call it is dropped, as
        # the chat endpoint answers a turn of only tool calls with content null
        self._pending = ""
        self._pending_logprobs: list[LogProb] = []
        self._tokens = 0

    def add(self, ev: ipc.Delta | ipc.Finish) -> list[Event]:
        out: list[Event] = []
        spent, self._tokens = ev.completion_tokens - self._tokens, ev.completion_tokens
        if ev.reasoning and not ev.text and not ev.tool_calls:
            self.reasoning_tokens += spent
        if ev.reasoning:
            if self._kind != "reasoning":
                out += self._open("reasoning")
            out.append(self._delta(ev.reasoning, []))
        if ev.text:
            out += self._message_text(ev.text, self._converted(ev.logprobs))
        for call in ev.tool_calls:
            self._pending, self._pending_logprobs = "", []
            out += self._close("completed")
            out += self._call(call)
        return out

    def finish(self, incomplete: bool) -> list[Event]:
        """The held whitespace when nothing else came, then the open item's end (incomplete at max tokens)."""
        out: list[Event] = []
        if self._pending and not self.calls:
            text, logprobs = self._pending, self._pending_logprobs
            self._pending, self._pending_logprobs = "", []
            out += self._open("message")
            out.append(self._delta(text, logprobs))
        return out + self._close("incomplete" if incomplete else "completed")

    def failed_output(self) -> list[OutputItem]:
        """The items so far when the generation fails, the open one as incomplete."""
        return self.output + ([self._item("incomplete")] if self._kind else [])

    def text(self) -> str:
        return "".join(part.text for item in self.output if isinstance(item, MessageItem) for part in item.content)

    # ---- items

    def _open(self, kind: str) -> list[Event]:
        out = self._close("completed")
        self._kind, self._text, self._logprobs = kind, [], []
        self._id = f"{'rs' if kind == 'reasoning' else 'msg'}_{uuid.uuid4().hex}"
        if kind == "reasoning":
            item: OutputItem = ReasoningItem(id=self._id, status="in_progress")
            part: ReasoningText | OutputText = ReasoningText(text="")
        else:
            item, part = MessageItem(id=self._id, status="in_progress"), OutputText(text="")
        out.append({"type": "response.output_item.added", "output_index": len(self.output), "item": item})
        out.append({"type": "response.content_part.added", "item_id": self._id, "output_index": len(self.output),
                    "content_index": 0, "part": part})
        return out

    def _message_text(self, text: str, logprobs: list[LogProb]) -> list[Event]:
        out: list[Event] = []
        if self._kind != "message":
            if not text.strip():
                self._pending += text
                self._pending_logprobs += logprobs
                return out
            text, logprobs = self._pending + text, self._pending_logprobs + logprobs
            self._pending, self._pending_logprobs = "", []
            out += self._open("message")
        out.append(self._delta(text, logprobs))
        return out

    def _delta(self, text: str, logprobs: list[LogProb]) -> Event:
        self._text.append(text)
        where = {"item_id": self._id, "output_index": len(self.output), "content_index": 0}
        if self._kind == "reasoning":
            return {"type": "response.reasoning_text.delta", **where, "delta": text}
        self._logprobs += logprobs
        return {"type": "response.output_text.delta", **where, "delta": text, "logprobs": logprobs}

    def _item(self, status: ItemStatus) -> OutputItem:
        text = "".join(self._text)
        if self._kind == "reasoning":
            return ReasoningItem(id=self._id, content=[ReasoningText(text=text)], status=status)
        return MessageItem(id=self._id, status=status, content=[OutputText(text=text, logprobs=self._logprobs)])

    def _close(self, status: ItemStatus) -> list[Event]:
        if self._kind is None:
            return []
        item = self._item(status)
        where = {"item_id": self._id, "output_index": len(self.output), "content_index": 0}
        part = item.content[0]  # type: ignore[union-attr]
        if isinstance(item, ReasoningItem):
            out: list[Event] = [{"type": "response.reasoning_text.done", **where, "text": part.text}]
        else:
            out = [{"type": "response.output_text.done", **where, "text": part.text, "logprobs": self._logprobs}]
        out.append({"type": "response.content_part.done", **where, "part": part})
        out.append({"type": "response.output_item.done", "output_index": len(self.output), "item": item})
        self.output.append(item)
        self._kind = None
        return out

    def _call(self, call: ToolCall) -> list[Event]:
        namespace, name = self.origin.get(call.name, (None, call.name))
        fields: dict[str, Any] = {"id": "fc_" + call.id.removeprefix("call_"), "call_id": call.id, "name": name,
                                  "namespace": namespace or UNSET}
        index = len(self.output)
        # a call cut by max_output_tokens: the arguments so far, in an item marked incomplete
        item = FunctionCallItem(**fields, arguments=call.arguments,
                                status="incomplete" if call.partial else "completed")
        where = {"item_id": item.id, "output_index": index}
        out = [{"type": "response.output_item.added", "output_index": index,
                "item": FunctionCallItem(**fields, arguments="", status="in_progress")}]
        if call.arguments:  # each call arrives whole: one delta carries all of its arguments
            out.append({"type": "response.function_call_arguments.delta", **where, "delta": call.arguments})
        out += [
            {"type": "response.function_call_arguments.done", **where, "arguments": call.arguments},
            {"type": "response.output_item.done", "output_index": index, "item": item},
        ]
        self.output.append(item)
        self.calls += 1
        return out

    def _converted(self, entries: Sequence[TokenLogprob]) -> list[LogProb]:
        if not self.logprobs:
            return []
        return [LogProb(token=e.token, bytes=list(e.bytes), logprob=e.logprob,
                        top_logprobs=[TopLogProb(token=t.token, bytes=list(t.bytes), logprob=t.logprob)
                                      for t in e.top])
                for e in entries]


class ResponseRenderer(Renderer):
    """The response object of one request: its echo of the request's settings around the output."""

    def __init__(self, request_id: str, model: str, req: ResponsesRequest, toolset: ToolSet, logprobs: bool) -> None:
        super().__init__(request_id, model, include_usage=False)
        self.req = req
        self.toolset = toolset
        self.logprobs = logprobs

    def writer(self) -> ItemWriter:
        return ItemWriter(self.toolset.origin, self.logprobs)

    def body(self, status: ResponseStatus, output: list[OutputItem], *, usage: ResponseUsage | None = None,
             error: ResponseError | None = None) -> Response:
        req = self.req
        reasoning = req.reasoning
        text = req.text
        return Response(
            id=self.request_id,
            created_at=self.created,
            status=status,
            completed_at=int(time.time()) if status == "completed" else None,
            error=error,
            incomplete_details=IncompleteDetails(reason="max_output_tokens") if status == "incomplete" else None,
            instructions=req.instructions,
            max_output_tokens=req.max_output_tokens,
            max_tool_calls=req.max_tool_calls,
            model=self.model,
            output=output,
            parallel_tool_calls=req.parallel_tool_calls is not False,
            prompt_cache_key=req.prompt_cache_key,
            reasoning=ReasoningEcho(effort=reasoning.effort if reasoning else None,
                                    summary=(reasoning.summary or reasoning.generate_summary) if reasoning else None),
            safety_identifier=req.safety_identifier,
            temperature=1.0 if req.temperature is None else req.temperature,
            text=TextConfig(format=(text.format if text else None) or TextFormat(type="text"),
                            verbosity=(text.verbosity if text else None) or "medium"),
            tool_choice="auto" if req.tool_choice is None else req.tool_choice,
            tools=req.tools or [],
            top_logprobs=req.top_logprobs or 0,
            top_p=1.0 if req.top_p is None else req.top_p,
            truncation=req.truncation or "disabled",
            usage=usage,
            user=req.user,
            metadata=req.metadata or {},
        )

    def usage_of(self, prompt_tokens: int, completion_tokens: int, writer: ItemWriter,
                 cached_tokens: int = 0) -> ResponseUsage:
        return ResponseUsage(input_tokens=prompt_tokens,
                             input_tokens_details=InputTokensDetails(cached_tokens=cached_tokens),
                             output_tokens=completion_tokens,
                             output_tokens_details=OutputTokensDetails(reasoning_tokens=writer.reasoning_tokens),
                             total_tokens=prompt_tokens + completion_tokens)


# the engine's names for what a Responses request calls otherwise (api/spelling.py)
ENGINE_NAMES = [
    ("max_tokens", "max_output_tokens"),
    ("response_format", "text.format"),
    (r"tools\[(\d+)\]\.function\.parameters", r"tools[\1].parameters"),
    (r"tools\[(\d+)\]\.function\.name", r"tools[\1].name"),
    ("messages", "input"),
]


def response_error(exc: APIError) -> ResponseError:
    """The response's error after the headers went out: OpenAI's server_error for a failure of ours."""
    code = "server_error" if exc.status >= 500 else (exc.code or "invalid_prompt")
    return ResponseError(code=code, message=exc.message, param=exc.param, type=exc.type)


def error_event(exc: APIError) -> Event:
    return {"type": "error", "code": exc.code or exc.type, "message": exc.message, "param": exc.param}
