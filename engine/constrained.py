"""Constrained decoding with llguidance: grammars written on rank 0, masks applied on every rank.

Every rank samples its own copy of each token, so every rank must mask the logits identically:
rank 0 turns response_format and forced tool calls into grammar text carried by the plan's
Insert, and each rank compiles that text against its own copy of the tokenizer. llguidance is a
small Rust wheel (Linux and macOS arm64) with no torch dependency, which is why it was chosen.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import llguidance
import mlx.core as mx
import numpy as np

log = logging.getLogger(__name__)

# Compact separators and no free whitespace: a model cannot pad JSON with endless blanks, and the
# text reads like json.dumps' default.
JSON_OPTIONS: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}

_lock = threading.Lock()
_tokenizer: Any = None
_ll: llguidance.LLTokenizer | None = None


class GrammarError(ValueError):
    """A schema or tool definition that cannot become a grammar; the message says why."""


def use_tokenizer(tokenizer: Any) -> None:
    """Every rank registers the tokenizer it loaded: grammars compile against it.

    llguidance's view is built in the background right away, so that the first constrained
    request does not stall the step loop of every rank while it is built.
    """
    global _tokenizer, _ll
    with _lock:
        _tokenizer, _ll = tokenizer, None
    threading.Thread(target=_warm_up, name="llguidance-tokenizer", daemon=True).start()


def _warm_up() -> None:
    try:
        ll_tokenizer()
    except GrammarError as exc:
        log.info("constrained decoding unavailable: %s", exc)


def ll_tokenizer() -> llguidance.LLTokenizer:
    """The llguidance view of the tokenizer, built once per process (about a second for 150k tokens)."""
    global _ll
    with _lock:
        if _ll is None:
            if _tokenizer is None:
                raise GrammarError("no tokenizer was registered for constrained decoding")
            import llguidance.hf

            try:
                _ll = llguidance.hf.from_tokenizer(_tokenizer._tokenizer, eos_token=sorted(_tokenizer.eos_token_ids))
            except Exception as exc:  # a tokenizer llguidance cannot read fails in its own ways
                raise GrammarError(f"this model's tokenizer does not support constrained decoding: {exc}") from None
        return _ll


def json_grammar(schema: dict[str, Any]) -> str:
    """Grammar text for one JSON value matching schema."""
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
    except ValueError as exc:
        raise GrammarError(f"invalid JSON schema: {exc}") from None


def tool_grammar(
    tools: list[dict[str, Any]],
    choice: str | dict[str, Any],
    parallel: bool,
    start: str,
    end: str,
    json_schema: dict[str, Any] | None = None,
) -> str:
    """Grammar for the json_tools format (`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`).

    choice "required" allows any declared tool, a named choice only that one; parallel allows
    several calls in a row. With choice "auto" and a json_schema, the output is either the JSON
    answer or tool calls.
    """
    named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    bodies = []
    for tool in tools:
        fn = tool.get("function", {})
        if named is not None and fn.get("name") != named:
            continue
        params = fn.get("parameters") or {"type": "object"}
        bodies.append({
            "type": "object",
            "properties": {"name": {"const": fn.get("name")}, "arguments": params},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        })
    if not bodies:
        raise GrammarError(f"tool_choice names a function that is not in tools: {named!r}")
    # Tool schemas come from clients as they are: unknown keywords are ignored rather than refused.
    schema = {**(bodies[0] if len(bodies) == 1 else {"anyOf": bodies}), "x-guidance": {**JSON_OPTIONS, "lenient": True}}
    lines = [
        f"call: {_literal(start)} \"\\n\" %json {json.dumps(schema)} \"\\n\" {_literal(end)}",
        'calls: call ("\\n" call)*' if parallel and named is None else "calls: call",
    ]
    if json_schema is not None and choice == "auto":
        answer = {**json_schema, "x-guidance": JSON_OPTIONS}
        lines.insert(0, f"start: calls | %json {json.dumps(answer)}")
    else:
        lines.insert(0, "start: calls")
    return llguidance.LLMatcher.grammar_from_lark("\n".join(lines))


def _literal(marker: str) -> str:
    """A marker in lark: a single special token by id (llguidance never matches those as text), else text."""
    ids = _tokenizer.encode(marker, add_special_tokens=False)
    if len(ids) == 1 and ll_tokenizer().is_special_token(ids[0]):
        return f"<[{ids[0]}]>"
    return json.dumps(marker)


def check(grammar: str) -> None:
    """Raise GrammarError unless grammar compiles: rank 0 checks before any rank builds a matcher."""
    error = llguidance.LLMatcher.validate_grammar(grammar, ll_tokenizer())
    if error:
        raise GrammarError(error)


class GrammarProcessor:
    """An mlx-lm logits processor that masks every token the grammar cannot accept next.

    It reads the newest sampled token from the context mlx-lm passes in, which forces that token
    to be evaluated: only constrained requests pay that synchronisation.
    """

    def __init__(self, grammar: str):
        ll = ll_tokenizer()
        # log_level 0: llguidance would print to stderr; a failure is logged here, once
        self.matcher = llguidance.LLMatcher(ll, grammar, log_level=0)
        self.eos = sorted(ll.eos_tokens)
        self.seen: int | None = None
        self.failed = False

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.seen is None:
            self.seen = tokens.size  # the first call sees only the prompt
        elif tokens.size > self.seen:
            self.matcher.consume_tokens(tokens[self.seen :].tolist())
            self.seen = tokens.size
        width = logits.shape[-1]
        allowed = np.zeros(width, dtype=bool)
        if self.matcher.is_error():
            if not self.failed:
                self.failed = True
                log.warning("grammar matcher failed (%s); ending the sequence", self.matcher.get_error())
            allowed[self.eos] = True  # unreachable while masking works; end rather than decode garbage
        else:
            bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
            n = min(width, bits.size)
            allowed[:n] = bits[:n].astype(bool)
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))
