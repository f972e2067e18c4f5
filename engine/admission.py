"""Rank 0: one admitted Generate becomes n batch requests (its choices), each with what every rank
needs to decode it identically (seed, grammar) and what rank 0 needs to report it (router, logprobs)."""

from __future__ import annotations

import os
from typing import Any

from ipc import Error, Generate

from engine import constrained
from engine.logprobs import TokenTexts
from engine.output import OutputRules, Router
from engine.lockstep.plan import Insert
from engine.scheduler import Request

# Tool formats a forced tool_choice can be enforced for by grammar (engine/constrained.py).
FORCEABLE_PARSERS = {"json_tools"}


class Refused(Exception):
    """The request cannot be honoured; error is the 400 the client gets."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.error = Error(status=400, error_type="invalid_request_error", message=message, param=param, code=code)


class Admission:
    """What rank 0 derives once from the tokenizer to admit requests."""

    def __init__(self, tokenizer: Any, vocab_size: int, context_length: int):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.rules = OutputRules(tokenizer)
        self.texts = TokenTexts(tokenizer)

    def requests(self, gen: Generate, tokens: list[int], outbox: Any, deadline: float) -> list[Request]:
        """The choices of gen, ready for the scheduler; raises Refused."""
        p = gen.params
        bad = [t for t in p.logit_bias if not 0 <= t < self.vocab_size]
        if bad:
            raise Refused(f"logit_bias names token id {bad[0]}, outside the vocabulary (0..{self.vocab_size - 1})",
                          "logit_bias")
        chat = gen.kind == "chat"
        tools = gen.tools if chat and gen.tools and gen.tool_choice != "none" else None
        grammar = self.grammar(gen, tools)
        machine = self.rules.machine(chat=chat, tools=tools is not None, stop=list(p.stop))
        initial = self.rules.initial_state(tokens, chat)
        seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(4), "little")
        echo = self.tokenizer.decode(tokens) if gen.echo and not chat else ""
        out = []
        for i in range(p.n):
            detok = self.tokenizer.detokenizer
            if hasattr(detok, "_maybe_trim_space"):
                # mlx-lm's BPE detokeniser drops a leading space; a byte-level BPE space is a byte the
                # model sampled, so the text keeps it and stays equal to the tokens' bytes.
                detok._maybe_trim_space = _keep

            insert = Insert(
                rid=gen.request_id if i == 0 else f"{gen.request_id}/{i}",
                tokens=tokens, max_tokens=min(p.max_tokens, self.context_length - len(tokens)),
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
                # choice i of a seeded request is the n=1 result with seed + i: reproducible, and distinct
                seed=(seed + i) & 0xFFFFFFFF,
                logit_bias=p.logit_bias, repetition_penalty=p.repetition_penalty,
                presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                logprobs=p.logprobs, grammar=grammar,
            )
            out.append(Request(
                insert=insert, outbox=outbox, prompt_tokens=len(tokens), deadline=deadline,
                detok=detok, router=Router(self.rules, machine, initial, tools,
                                                               gen.parallel_tool_calls),
                group=gen.request_id, index=i, top_logprobs=p.top_logprobs,
                texts=self.texts if p.logprobs else None, echo=echo,
            ))
        return out

    def grammar(self, gen: Generate, tools: list[dict[str, Any]] | None) -> str:
        """The grammar enforcing a forced tool call or a response_format, or "" when nothing is forced."""
        choice = gen.tool_choice or "auto"
        forced = tools is not None and choice != "auto"
        if not forced and gen.json_schema is None:
            return ""
        param = "tool_choice" if forced else "response_format"
        try:
            if tools is not None and (forced or gen.json_schema is not None):
                start, end = self.rules.tool or (None, None)
                if self.rules.parser_name not in FORCEABLE_PARSERS or start is None or end is None:
                    raise Refused(
                        f"this model's tool-call format ({self.rules.parser_name or 'none'}) cannot be enforced, so "
                        f"{'a forced tool_choice' if forced else 'response_format together with tools'} is not "
                        "supported for it; use tool_choice 'auto'" + ("" if forced else " without response_format"),
                        param, "unsupported_parameter")
                grammar = constrained.tool_grammar(tools, choice, gen.parallel_tool_calls, start, end,
                                                   None if forced else gen.json_schema)
            else:
                grammar = constrained.json_grammar(gen.json_schema or {})
        except constrained.GrammarError as exc:
            if exc.param:
                raise Refused(str(exc), exc.param) from None
            raise Refused(f"cannot enforce {param}: {exc}", param) from None
        return grammar


def _keep(text: str) -> str:
    return text
