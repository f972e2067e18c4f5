"""What every tool-call format knows about itself: its envelope, how to parse it, how to enforce it.

One module per format under engine/toolformats/ holds one ToolFormat; engine/toolformats/__init__.py finds the
model's. Rank 0 alone uses them (no MLX here): the text splitter (engine/rank0/output.py) routes the text
between `start` and `end` to `parse`, and admission (engine/rank0/admission.py) asks `grammar` for the lark text
that makes the model write a forced call in its own envelope, which engine/decoding/constrained.py compiles.
"""

from __future__ import annotations

from typing import Any, Protocol


class GrammarParts(Protocol):
    """The pieces a format's grammar is written with, bound to one tokenizer (engine/decoding/constrained.py).
    Expressions it returns may name rules it adds to the grammar itself (named part_N)."""

    def literal(self, text: str) -> str:
        """A marker as a lark terminal: one special token by id where the tokenizer has it whole, else text."""

    def json(self, schema: dict[str, Any], blame: tuple[str, str] | None = None) -> str:
        """A lark expression for one JSON value of schema (compact separators, unknown keywords ignored).
        blame: (what, param) naming the tool whose schema this is, for the error when it cannot be enforced."""

    def text(self, close: str, schema: dict[str, Any] | None = None, forbid: tuple[str, ...] = (),
             strip: bool = False, blame: tuple[str, str] | None = None) -> str:
        """A lark expression for raw text, then `close`: an XML parameter's string value. The text never
        contains `close` nor any of `forbid`; it keeps to schema's enum, const, minLength and maxLength; with
        strip, it neither starts nor ends with whitespace (for parsers that strip values). An enum choice that
        breaks these rules raises GrammarError, blamed as in `json`."""

    def rule(self, body: str) -> str:
        """A rule of its own for body (a lark expression written once, used in several places): its name."""


class ToolFormat:
    """A model family's tool-call format. Subclasses set the markers and implement parse and grammar."""

    name: str = ""
    # the text that opens a call (or a section of calls) and the text that closes it ("": the call runs to the
    # end of the output, as mistral's)
    start: str = ""
    end: str = ""

    def parse(self, text: str, tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
        """The calls in the text between start and end: [{"name": str, "arguments": dict or JSON text}].
        Raises ValueError (or any parser error) on text that is not a call."""
        raise NotImplementedError

    def grammar(self, parts: GrammarParts, tools: list[dict[str, Any]], named: str | None, parallel: bool) -> str:
        """Lark rules whose start rule `calls` writes one call (several when parallel) of the declared tools
        (only `named` when given), from `start` through `end`, each argument constrained by its schema.
        Raises engine.decoding.constrained.GrammarError for a tool that cannot be enforced."""
        raise NotImplementedError

    @property
    def forceable(self) -> bool:
        """Whether a forced call can be enforced in this format (its module writes a grammar)."""
        return type(self).grammar is not ToolFormat.grammar

    def partial(self, text: str, tools: list[dict[str, Any]] | None = None) -> tuple[str | None, str]:
        """A call cut short (max_tokens): its name, once written whole, and the arguments text so far (a prefix
        of the JSON object the whole call's arguments serialise to, or the JSON text the model wrote). tools:
        the declared ones, whose schemas say which values an XML-style format writes as raw text."""
        return None, ""
