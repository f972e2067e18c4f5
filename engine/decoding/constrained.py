"""Constrained decoding with llguidance: grammars written on rank 0, masks applied on every rank.

Every rank samples its own copy of each token, so every rank must mask the logits identically:
rank 0 turns response_format and forced tool calls into grammar text carried by the plan's
Insert, and each rank compiles that text against its own copy of the tokenizer. llguidance is a
small Rust wheel (Linux and macOS arm64) with no torch dependency, which is why it was chosen.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import OrderedDict
from typing import Any

import llguidance
import mlx.core as mx
import numpy as np

from engine import mlx_compat
from engine.decoding.grammar_error import GrammarError
from engine.decoding.schema_options import JSON_OPTIONS, must_end
from engine.decoding.tool_parts import ToolParts
from engine.lockstep.plan import GRAMMAR_CACHE_SIZE

log = logging.getLogger(__name__)

# Compiling a grammar happens on every rank inside the step (a follower learns it from the plan), so
# it holds up the whole batch: rank 0 refuses a grammar of more symbols than this (a 3,900-property
# object has 31,000 and compiles in about a second here). A count, not a clock, so that whether a
# schema is refused does not depend on how busy the machine is.
MAX_GRAMMAR_SYMBOLS = 30_000
# llguidance bounds the Earley items of a mask step by step_max_items (50,000), but a row a token
# commits by max_items_in_row (2,000 by default): a row the mask computed could then be refused when
# its token was consumed (any object of 500 optional properties did so at its first key). One bound
# for both makes the matcher accept every token its mask allows.
STEP_MAX_ITEMS = 50_000
LIMITS = llguidance.LLParserLimits(max_grammar_size=MAX_GRAMMAR_SYMBOLS, step_max_items=STEP_MAX_ITEMS,
                                   max_items_in_row=STEP_MAX_ITEMS)
# llguidance's errors when a grammar exceeds one of its limits (llguidance/parser/src/api.rs and earley).
_TOO_BIG = ("grammar size (number of symbols) too big", "initial lexer configuration (grammar) too big",
            "schema too large", "Too many items", "Current row has")


class Grammars:
    """Grammars compiled against one rank's tokenizer: rank 0 writes and checks them, every rank
    builds from them the matchers that mask its logits."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._ll: llguidance.LLTokenizer | None = None
        # compiled once per rank, by text: n choices, and a schema sent again, share one compile
        self._compiled: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        """llguidance's view of the tokenizer, built on first use (about a second for 150k tokens)."""
        with self._lock:
            if self._ll is None:
                import llguidance.hf

                try:
                    self._ll = llguidance.hf.from_tokenizer(mlx_compat.hf_tokenizer(self.tokenizer),
                                                            eos_token=sorted(self.tokenizer.eos_token_ids))
                except Exception as exc:  # a tokenizer llguidance cannot read fails in its own ways
                    raise GrammarError(f"this model's tokenizer does not support constrained decoding: {exc}") \
                        from None
            return self._ll

    def warm_up_in_background(self) -> None:
        """Build llguidance's view now, in a thread of its own, so that the first constrained request
        does not stall the step loop of every rank while it is built."""
        threading.Thread(target=self._warm_up, name="llguidance-tokenizer", daemon=True).start()

    def _warm_up(self) -> None:
        try:
            self.ll_tokenizer()
        except GrammarError as exc:
            log.info("constrained decoding unavailable: %s", exc)

    def json_grammar(self, schema: dict[str, Any]) -> str:
        """Grammar text for one JSON value matching schema, checked; raises GrammarError."""
        must_end(schema, "invalid JSON schema")
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
            self.check(grammar)
        except ValueError as exc:  # GrammarError included
            raise GrammarError(f"invalid JSON schema: {_reason(str(exc))}") from None
        return grammar

    def tool_grammar(self, fmt: Any, tools: list[dict[str, Any]], choice: str | dict[str, Any], parallel: bool,
                     json_schema: dict[str, Any] | None = None) -> str:
        """Checked grammar for forced calls in fmt, the model's tool-call format (engine/toolformats).

        choice "required" allows any declared tool, a named choice only that one; parallel allows
        several calls in a row. With choice "auto" and a json_schema, the output is either the JSON
        answer or tool calls. Raises GrammarError, naming the tool whose schema is at fault.
        """

        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        parts = ToolParts(self)
        calls = fmt.grammar(parts, tools, named, parallel)
        lines = ["start: calls", calls, *parts.rules]
        if json_schema is not None and choice == "auto":
            must_end(json_schema, "response_format is not a JSON schema that can be enforced", "response_format")
            answer = {**json_schema, "x-guidance": JSON_OPTIONS}
            lines[0] = f"start: calls | %json {json.dumps(answer)}"
            parts.schemas.append(("response_format", "response_format", answer))
        try:
            grammar = llguidance.LLMatcher.grammar_from_lark("\n".join(lines))
            self.check(grammar)
        except ValueError as exc:  # GrammarError included
            self._blame(parts.schemas)
            raise GrammarError(_reason(str(exc))) from None
        return grammar

    def _blame(self, schemas: list[tuple[str, str, dict[str, Any]]]) -> None:
        """Raise GrammarError naming the first schema that fails on its own (only after the whole failed)."""
        for what, param, schema in schemas:
            try:
                self.check(llguidance.LLMatcher.grammar_from_json_schema(schema))
            except ValueError as exc:  # GrammarError included
                raise GrammarError(f"{what} is not a JSON schema that can be enforced: {_reason(str(exc))}",
                                   param) from None

    def check(self, grammar: str) -> None:
        """Raise GrammarError unless grammar compiles within LIMITS and admits some text: rank 0 checks
        before any rank builds a matcher."""
        t0 = time.monotonic()
        compiled = self._compile(grammar)
        took = time.monotonic() - t0
        if compiled.is_error():
            raise GrammarError(_limit_or(compiled.get_error()))
        if took > 1.0:
            log.info("a grammar of %d characters took %.1f s to compile", len(grammar), took)
        probe = compiled.deep_copy()
        probe.compute_bitmask()
        if probe.is_error():  # a schema whose references only loop compiles, then allows no token
            self._forget(grammar)
            log.debug("grammar allows no first token: %s", probe.get_error())
            raise GrammarError("no value can satisfy it")
        # The text every value starts with is what the first consumed token makes the matcher derive:
        # an endless one (references that require themselves) fails there, so derive it here first.
        if not probe.consume_tokens(probe.compute_ff_tokens()) or probe.is_error():
            self._forget(grammar)
            error = probe.get_error()
            log.debug("grammar's forced start failed: %s", error)
            raise GrammarError("no finite value can satisfy it" if "ff_tokens" in error else _limit_or(error))

    def processor(self, grammar: str) -> GrammarProcessor:
        """The logits processor that enforces grammar for one request (a copy of the compiled grammar)."""
        return GrammarProcessor(self._compile(grammar).deep_copy())

    def _compile(self, grammar: str) -> llguidance.LLMatcher:
        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is not None:
                self._compiled.move_to_end(grammar)
                return compiled
        # Outside the lock: a long compile on rank 0's admission thread must not stall the step thread.
        compiled = llguidance.LLMatcher(self.ll_tokenizer(), grammar, log_level=0, limits=LIMITS)
        if not compiled.is_error():
            with self._lock:
                self._compiled[grammar] = compiled
                while len(self._compiled) > GRAMMAR_CACHE_SIZE:
                    self._compiled.popitem(last=False)
        return compiled

    def _forget(self, grammar: str) -> None:
        with self._lock:
            self._compiled.pop(grammar, None)


def _limit_or(error: str) -> str:
    """llguidance's error, or the sentence a client can act on when the grammar exceeded LIMITS."""
    if any(mark in error for mark in _TOO_BIG):
        log.debug("grammar exceeds llguidance's limits: %s", error)
        return (f"it is too complex to enforce on every rank (more than {MAX_GRAMMAR_SYMBOLS:,} grammar symbols "
                f"or {STEP_MAX_ITEMS:,} parser items a step); simplify the schema")
    return error


def _reason(error: str) -> str:
    """llguidance's error as one short line: without the grammar listing or matcher state it appends."""
    text = error.split("\n<state>", 1)[0]
    text = re.split(r"\n +\d+ \| ", text, maxsplit=1)[0]
    text = re.sub(r"^at \d+\(\d+\): ", "", text).removeprefix("failed to compile JSON schema: ")
    text = " ".join(text.split())
    return text if len(text) <= 200 else text[:197] + "..."


class GrammarFailed(RuntimeError):
    """The matcher failed mid-output (a limit of LIMITS reached, or a token its mask allowed refused):
    the output can no longer be kept to the grammar. Understood, so logged without a traceback."""


class GrammarProcessor:
    """An mlx-lm logits processor that masks every token the grammar cannot accept next.

    It reads the newest sampled token from the context mlx-lm passes in, which forces that token
    to be evaluated: only constrained requests pay that synchronisation.
    """

    def __init__(self, matcher: llguidance.LLMatcher):
        self.matcher = matcher
        self.seen: int | None = None

    def __call__(self, tokens: mx.array, logits: mx.array) -> mx.array:
        if self.seen is None:
            self.seen = tokens.size  # the first call sees only the prompt
        elif tokens.size > self.seen:
            new, self.seen = tokens[self.seen :].tolist(), tokens.size
            for token in new:
                # mlx-lm steps once more before a finished sequence leaves the batch, so the EOS that
                # ended it can arrive here; a stopped matcher would count it as an error.
                if self.matcher.is_stopped():
                    break
                self.matcher.consume_token(token)
        self._fail_on_error()
        mask = self.matcher.compute_bitmask()
        self._fail_on_error()  # a mask past a limit allows nothing: no token is sampled from it
        width = logits.shape[-1]
        allowed = np.zeros(width, dtype=bool)
        bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
        n = min(width, bits.size)
        allowed[:n] = bits[:n].astype(bool)
        return mx.where(mx.array(allowed), logits, mx.array(-mx.inf, dtype=logits.dtype))

    def _fail_on_error(self) -> None:
        if not self.matcher.is_error():
            return
        # The error quotes the grammar (the client's schema) and the text so far: DEBUG only. The
        # request ends with an error rather than with output that breaks its schema.
        error = self.matcher.get_error()
        log.debug("grammar matcher error: %s", error)
        if any(mark in error for mark in _TOO_BIG):
            raise GrammarFailed("the requested format proved too complex to enforce at this point of the output "
                                f"(more than {STEP_MAX_ITEMS:,} parser items a step); simplify the schema")
        raise GrammarFailed("the output could not be kept to the requested format (the grammar refused a token "
                            "its own mask allowed)")
