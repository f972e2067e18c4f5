"""The pieces tool-call formats write their grammars with (engine/toolformats/base.py GrammarParts), bound to
one tokenizer: markers as special tokens where the tokenizer has them whole, JSON values by schema, and raw
text that cannot run past its closing tag.

Raw text is a lazy lexeme (llguidance's `[lazy]`: the shortest text that ends with the closing tag), so the
first closing tag the model writes ends the value; the text itself is a regex intersected with the negation
of every marker it must not contain (the format's end marker: the splitter would end the call there).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from engine.decoding.grammar_error import GrammarError
from engine.decoding.schema_options import TOOL_OPTIONS, must_end

# Characters with a meaning in llguidance's regex syntax (Rust's regex plus & and ~), and / that ends a lark regex.
_REGEX_META = set("\\.+*?()|[]{}^$#&-~/")


class Tokenizers(Protocol):
    """What the parts need of engine/decoding/constrained.py's Grammars (named here, so neither imports the other)."""

    tokenizer: Any

    def ll_tokenizer(self) -> Any: ...


class ToolParts:
    """GrammarParts for one grammar: the rules it adds and the schemas it used, for blaming a failure."""

    def __init__(self, grammars: Tokenizers):
        self.grammars = grammars
        self.rules: list[str] = []
        self.schemas: list[tuple[str, str, dict[str, Any]]] = []  # (what, param, schema)
        self._shared: dict[str, str] = {}

    def literal(self, text: str) -> str:
        # Special tokens by id (llguidance never matches one as text), the text between them as text:
        # Kimi K3's "<|open|>tools<|sep|>" is two special tokens around a word.
        tokenizer = self.grammars.tokenizer
        ll = self.grammars.ll_tokenizer()
        pieces: list[str] = []
        plain: list[int] = []
        for token in tokenizer.encode(text, add_special_tokens=False):
            if not ll.is_special_token(token):
                plain.append(token)
                continue
            if plain:
                pieces.append(json.dumps(tokenizer.decode(plain)))
                plain = []
            pieces.append(f"<[{token}]>")
        if not pieces:
            return json.dumps(text)
        if plain:
            pieces.append(json.dumps(tokenizer.decode(plain)))
        return " ".join(pieces)

    def json(self, schema: dict[str, Any], blame: tuple[str, str] | None = None) -> str:
        what, param = blame or ("a tool's schema", None)
        must_end(schema, f"{what} is not a JSON schema that can be enforced", param)
        schema = {**schema, "x-guidance": TOOL_OPTIONS}
        self.schemas.append((what, param, schema))
        return f"%json {json.dumps(schema)}"

    def text(self, close: str, schema: dict[str, Any] | None = None, forbid: tuple[str, ...] = (),
             strip: bool = False, blame: tuple[str, str] | None = None) -> str:
        schema = schema or {}
        end = self.literal(close)
        choices = schema.get("enum") if "const" not in schema else [schema["const"]]
        if isinstance(choices, list) and choices and all(isinstance(c, str) for c in choices):
            for choice in choices:
                _must_read_back(choice, (close, *forbid), strip, blame)
            # as literals: a choice that spells a special token is written as that token, as the model would
            return "(" + " | ".join(self.literal(c) for c in choices) + f") {end}"
        low, high = schema.get("minLength", 0), schema.get("maxLength")
        body = "(.|\\n)*"
        if isinstance(low, int) and low > 0 or isinstance(high, int):
            body = f"(.|\\n){{{max(0, int(low or 0))},{'' if high is None else int(high)}}}"
        terminal = f"/{body}/"
        if strip:  # no whitespace at either end: what a parser that strips values reads back unchanged
            terminal += " & /(\\S((.|\\n)*\\S)?)?/"
        markers = "|".join(_escape(m) for m in (close, *forbid) if m)
        terminal += f" & ~/(.|\\n)*({markers})(.|\\n)*/"
        name = self.rule(f"{terminal}", terminal=True)
        if end.startswith("<["):  # a special token ends the text by itself: it is never text
            return f"{name} {end}"
        return self.rule(f"{name} {end}", lazy=True)

    def rule(self, body: str, *, terminal: bool = False, lazy: bool = False) -> str:
        key = f"{terminal}{lazy}{body}"
        if key in self._shared:
            return self._shared[key]
        name = f"{'PART' if terminal else 'part'}_{len(self._shared)}"
        self._shared[key] = name
        self.rules.append(f"{name}{'[lazy]' if lazy else ''}: {body}")
        return name


def _must_read_back(choice: str, markers: tuple[str, ...], strip: bool, blame: tuple[str, str] | None) -> None:
    """Raise GrammarError for an enum choice the format's parser would not read back whole: one that holds the
    marker ending the value (or the call), or, for a parser that strips values, one with whitespace around it."""
    what, param = blame or ("a tool's schema", None)
    cut = next((m for m in markers if m and m in choice), None)
    if cut is not None:
        why = f"its parser would end the value at {cut!r}"
    elif strip and choice != choice.strip():
        why = "its parser strips the whitespace around a value"
    else:
        return
    raise GrammarError(f"{what}: the enum value {choice!r} cannot be written in this model's tool-call format: "
                       f"{why}; leave it out of the enum", param)


def _escape(text: str) -> str:
    return "".join("\\n" if c == "\n" else "\\t" if c == "\t" else f"\\{c}" if c in _REGEX_META else c
                   for c in text)
