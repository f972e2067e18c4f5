"""Rank 0: one choice's decoded text routed into content, reasoning and tool calls, cut at stop strings.

Built on mlx-lm's TextStateMachine, which matches markers in text rather than token ids and holds
back only text that may still grow into a marker or a stop string: a `<tool_call>` split across
tokens never reaches content, and plain content is never buffered.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from mlx_lm.generate import TextStateMachine

from engine import toolformats
from engine.rank0.cut_call import cut_call, with_cut_call
from engine.rank0.piece import Piece
from engine.rank0.tool_prompt import FALLBACK_FORMAT
from engine.toolformats.base import ToolFormat
from engine.toolformats.mlx_parsed import MlxParsed
from ipc.messages import ToolCall

log = logging.getLogger(__name__)


class OutputRules:
    """The tokenizer's markers (thinking, tool calls) and its tool parser, read once."""

    def __init__(self, tokenizer: Any):
        self.think = (tokenizer.think_start, tokenizer.think_end) if tokenizer.has_thinking else None
        # the model's tool-call format (engine/toolformats) knows its markers and parses its calls
        self.format = _tool_format(tokenizer)
        self.tool = (self.format.start, self.format.end) if self.format is not None else None
        self.parser = self.format.parse if self.format is not None else None
        self.parser_name = self.format.name if self.format is not None else ""
        self.markers = tuple(getattr(tokenizer, "structural_markers", ()) or ())
        self.response_transitions = dict(getattr(tokenizer, "response_transitions", {}) or {})
        self.response_initial = getattr(tokenizer, "response_initial_state", None)
        self.tokenizer = tokenizer
        # a format mlx-lm has no parser for may have channels of its own (harmony's analysis, final, commentary)
        response = getattr(self.format, "response_format", None) or {}
        if response and not self.response_transitions:
            self.response_transitions = dict(response["transitions"])
            self.response_initial = response.get("initial_state")
        own = toolformats.for_tokenizer(tokenizer) if self.parser is None else None
        if own is not None:  # a format mlx-lm has no parser for: its markers, its parser, its channels
            self.tool, self.parser, self.parser_name = (own.start, own.end), own.parse, own.name
            response = getattr(own, "response_format", None) or {}
            if response and not self.response_transitions:
                self.response_transitions = dict(response["transitions"])
                self.response_initial = response.get("initial_state")

    def initial_state(self, prompt: list[int], chat: bool) -> str:
        """"reasoning" when the prompt leaves the model inside a think block (as mlx-lm decides)."""
        if not chat:
            return "normal"
        state = "normal"
        if self.think is not None and self.tokenizer.rfind_think_start(prompt) > self.tokenizer.rfind_think_end(prompt):
            state = "reasoning"
        return self.response_initial or state

    def machine(self, *, chat: bool, tools: bool, stop: list[str]) -> TextStateMachine:
        """Transitions for one request; a stop string ends the text in every state."""
        t: dict[Any, list[tuple[str, Any]]] = {}
        if chat and self.think is not None:
            t.setdefault("normal", []).append((self.think[0], "reasoning"))
            t["reasoning"] = [(self.think[1], "normal")]
        if chat and tools and self.tool is not None:
            targets = {dst for edges in self.response_transitions.values() for _, dst in edges}
            if "tool" not in targets:
                t.setdefault("normal", []).append((self.tool[0], "tool"))
            if "reasoning" in t:
                t["reasoning"].append((self.tool[0], "tool"))
            t["tool"] = [(self.tool[1], "normal")] if self.tool[1] else []
        if chat:
            for marker in self.markers:
                t.setdefault("normal", []).append((marker, "normal"))
            for state, edges in self.response_transitions.items():
                # without tools a format's call is no call: its text stays where the call would start
                t.setdefault(state, []).extend(e for e in edges if tools or e[1] != "tool")
        # A stop string leads to a state of its own, ("stop", s), that nothing leaves: the splitter ends the
        # choice there and can say which string it was (a None target would end the text without saying).
        for state in set(t) | {"normal", "reasoning"}:
            for s in stop:
                t.setdefault(state, []).append((s, ("stop", s)))
        for s in stop:
            t[("stop", s)] = []  # type: ignore[index]
        return TextStateMachine(t or None)


def _tool_format(tokenizer: Any) -> ToolFormat | None:
    """The format's module, or mlx-lm's parser alone for a format without one (parsed, never forced); a model with
    no tool-call format gets the JSON envelope its system prompt describes (engine/rank0/tool_prompt.py)."""
    fmt = toolformats.for_tokenizer(tokenizer)
    if fmt is None and tokenizer.has_tool_calling:
        fmt = MlxParsed(toolformats.format_name(tokenizer))
    return fmt if fmt is not None else toolformats.format_named(FALLBACK_FORMAT)


class TextSplitter:
    """Feeds one choice's text through its state machine; tool text is parsed when its call closes."""

    def __init__(self, rules: OutputRules, machine: TextStateMachine, initial: str,
                 tools: list[dict[str, Any]] | None, parallel: bool):
        self.rules = rules
        self.state = machine.make_state(initial)
        self.tools = tools
        self.parallel = parallel
        self.tool_text = ""
        self.calls = 0
        self.stop_sequence: str | None = None  # the stop string that ended the choice
        # Whitespace right after a think block or a tool call waits until real content follows:
        # "</think>\n\nHi" gives content "Hi", and the newlines between tool calls vanish.
        self.hold: str | None = None

    def feed(self, text: str) -> tuple[Piece, bool]:
        """Route new text; True when the choice must end (a stop string, or its one allowed tool call)."""
        piece = Piece()
        if self.stop_sequence is not None:
            return piece, True
        if not text:
            return piece, False
        self.state, segments = TextStateMachine.split(self.state, text)
        ended = False
        for i, (state, chunk) in enumerate(segments):
            last = i == len(segments) - 1
            if isinstance(state, tuple):  # ("stop", s): what follows the stop string is dropped
                self.stop_sequence = state[1]
                ended = True
                break
            self._route(piece, state, chunk)
            if not last:
                if state == "tool" and isinstance(segments[i + 1][0], tuple):
                    self._cut_call(piece)  # a stop string inside a call cuts it, as max_tokens would
                elif state == "tool":
                    self._close_call(piece)
                    if not self.parallel and self.calls:
                        ended = True
                        break
                if segments[i + 1][0] == "normal" and state in ("tool", "reasoning"):
                    self.hold = ""
        return piece, ended

    def finish(self, reason: str = "stop") -> Piece:
        """The text still held back when generation stops (reason "stop" at EOS, "length" at max_tokens) goes
        where it belongs."""
        piece = Piece()
        if self.stop_sequence is not None:
            return piece
        self.state, rest, state = TextStateMachine.flush(self.state)
        self._route(piece, state, rest)
        if state == "tool":
            self._cut_call(piece, length=reason == "length")
        return piece

    def _cut_call(self, piece: Piece, length: bool = False) -> None:
        """A call whose end marker never came (cut by max_tokens, a stop string or EOS) counts if it parses;
        cut by max_tokens it is reported partial, with its name and the arguments so far, so the client
        learns what was cut. Its text never becomes content, so a truncated call leaks no markup."""
        text, self.tool_text = self.tool_text, ""
        if not text:
            return
        calls = parse_calls(self.rules.parser, text, self.tools, closed=False)
        if length:
            calls = with_cut_call(calls, cut_call(self.rules.format, text, self.tools))
        piece.tool_calls.extend(calls or [])
        self.calls += len(calls or [])

    def _route(self, piece: Piece, state: str, chunk: str) -> None:
        if state == "reasoning":
            piece.reasoning += chunk
        elif state == "tool":
            self.tool_text += chunk
        elif state != "normal":
            return  # a message header of a channel format (harmony's): no one's text, as mlx-lm drops it
        elif self.hold is not None:
            self.hold += chunk
            if self.hold.strip():
                piece.content += self.hold.lstrip()
                self.hold = None
        else:
            piece.content += chunk

    def _close_call(self, piece: Piece) -> None:
        text, self.tool_text = self.tool_text, ""
        calls = parse_calls(self.rules.parser, text, self.tools)
        if calls is None:
            # A closed call that does not parse: the model's own words, markers included, rather
            # than a silent drop.
            start, end = self.rules.tool or ("", "")
            piece.content += f"{start}{text}{end or ''}"
            return
        piece.tool_calls.extend(calls)
        self.calls += len(calls)


def parse_calls(parser: Any, text: str, tools: list[dict[str, Any]] | None,
                closed: bool = True) -> list[ToolCall] | None:
    """The format's parser output as ToolCalls with ids and JSON-text arguments; None when it fails.

    An unclosed call (closed=False) is usually cut short, so its failure is logged at DEBUG only.
    """
    try:
        parsed = parser(text, tools)
        items = parsed if isinstance(parsed, list) else [parsed]
        calls = []
        for item in items:
            args = _arguments(item.get("arguments"))
            if args is None:
                if closed:  # a lenient parser's raw text (Kimi K2's falls back to it), an array: not a call's input
                    raise ValueError(f"the arguments of {item.get('name')!r} are not a JSON object")
                continue  # cut text: no call
            calls.append(ToolCall(id=item.get("id") or f"call_{uuid.uuid4().hex[:24]}", name=str(item["name"]),
                                  arguments=args))
        return calls or None
    except Exception as exc:  # each parser raises its own errors (JSON, regex, KeyError) on bad model text
        log.log(logging.WARNING if closed else logging.DEBUG, "could not parse a %s tool call (%s: %s)",
                "closed" if closed else "unclosed", type(exc).__name__, exc)
        return None


def _arguments(args: Any) -> str | None:
    """A call's arguments as the JSON object text every dialect can hand its client (none at all: `{}`), or None
    when they are not an object (ipc.ToolCall promises one)."""
    if args is None or isinstance(args, str) and not args.strip():
        return "{}"
    if isinstance(args, str):
        try:
            return args if isinstance(json.loads(args), dict) else None
        except ValueError:
            return None
    return json.dumps(args, ensure_ascii=False) if isinstance(args, dict) else None
