"""Rank 0 turns an admitted Generate into work: its prompt into tokens (the Prompter), then into n
batch requests (its choices), each with what every rank needs to decode it identically (seed,
grammar) and what rank 0 needs to report it (splitter, logprobs)."""

from __future__ import annotations

import json
import logging
import os
from typing import Any

from engine import mlx_compat
from engine.decoding.constrained import GrammarError, Grammars
from engine.lockstep.plan import Insert
from engine.rank0 import validate
from engine.rank0.errors import Refused
from engine.rank0.kv_budget import KVBudget
from engine.rank0.logprobs import TokenTexts
from engine.rank0.output import OutputRules, TextSplitter
from engine.rank0.reasoning import ReasoningLevels, template_source
from engine.rank0.requests import Request
from engine.rank0.text_only import ClientText
from engine.rank0.tool_prompt import renders_tools, with_tools_described
from engine.vision.parts import image_parts, refuse_images
from ipc import Detokenize, Detokenized, Generate, Tokenize, Tokenized

log = logging.getLogger(__name__)


class Admission:
    """What rank 0 derives once from the tokenizer to admit requests."""

    def __init__(self, tokenizer: Any, vocab_size: int, context_length: int, grammars: Grammars,
                 kv: KVBudget | None = None):
        self.tokenizer = tokenizer
        self.grammars = grammars
        self.kv = kv if kv is not None else KVBudget(0, 0)
        self.vocab_size = vocab_size
        self.context_length = context_length
        self.rules = OutputRules(tokenizer)
        self.texts = TokenTexts(tokenizer)
        self.special_texts = _special_texts(tokenizer)
        self.vision: Any = None  # engine/vision/prompt.py VisionPrompts: the features of a prompt's images

    def requests(self, gen: Generate, tokens: list[int], outbox: Any, deadline: float) -> list[Request]:
        """The choices of gen, ready for the scheduler; raises Refused."""
        p = gen.params
        # max_tokens 0 (completions with echo): the batch samples one token after the prompt, which is dropped
        score_only = p.max_tokens == 0
        max_tokens = min(max(1, p.max_tokens), self.context_length - len(tokens))
        room = self.kv.room(len(tokens), p.n)
        if p.max_tokens_default and room is not None:  # no limit from the client: as many as the budget holds
            max_tokens = max(1, min(max_tokens, room))
        too_big = self.kv.refusal(len(tokens), max_tokens, p.n, client_limit=not p.max_tokens_default)
        if too_big:  # it would wait forever: even alone, with the prefix cache empty, it does not fit
            # a limit the server chose is not the client's to lower: its prompt is what does not fit
            param = "max_tokens" if not p.max_tokens_default else "messages" if gen.kind == "chat" else "prompt"
            raise Refused(too_big, param, "kv_memory_exceeded")
        bad = [t for t in p.logit_bias if not 0 <= t < self.vocab_size]
        if bad:
            raise Refused(f"logit_bias names token id {bad[0]}, outside the vocabulary (0..{self.vocab_size - 1})",
                          "logit_bias")
        chat = gen.kind == "chat"
        tools = gen.tools if chat and gen.tools and gen.tool_choice != "none" else None
        grammar = self.grammar(gen, tools)
        machine = self.rules.machine(chat=chat, tools=tools is not None, stop=_free_text_stop(p.stop, grammar))
        # Constrained JSON without a call is the answer itself, whatever the prompt leaves open (a think block,
        # harmony's channel header): its grammar writes no marker that would lead there.
        answer = bool(grammar) and (tools is None or (gen.tool_choice or "auto") == "auto")
        initial = "normal" if answer else self.rules.initial_state(tokens, chat)
        seed = p.seed if p.seed is not None else int.from_bytes(os.urandom(4), "little")
        echo = self.tokenizer.decode(tokens) if gen.echo and not chat else ""
        # echo with logprobs: the prompt's own logprobs come first (engine/lockstep/prompt_logprobs.py)
        prompt_logprobs = p.top_logprobs if gen.echo and p.logprobs and not chat else -1
        out = []
        for i in range(p.n):
            detok = self.tokenizer.detokenizer
            mlx_compat.keep_leading_space(detok)
            insert = Insert(
                rid=gen.request_id if i == 0 else f"{gen.request_id}/{i}",
                tokens=tokens, max_tokens=max_tokens,
                temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, min_p=p.min_p,
                # choice i of a seeded request is the n=1 result with seed + i: reproducible, and distinct
                seed=(seed + i) & 0xFFFFFFFF,
                logit_bias=p.logit_bias, repetition_penalty=p.repetition_penalty,
                presence_penalty=p.presence_penalty, frequency_penalty=p.frequency_penalty,
                logprobs=p.logprobs and not score_only, grammar=grammar, prompt_logprobs=prompt_logprobs,
                images=self.vision.image_rows(tokens) if self.vision is not None else [],
            )
            out.append(Request(
                insert=insert, outbox=outbox, prompt_tokens=len(tokens), deadline=deadline,
                detok=detok, splitter=TextSplitter(self.rules, machine, initial, tools, gen.parallel_tool_calls),
                group=gen.request_id, index=i, top_logprobs=p.top_logprobs,
                texts=self.texts if p.logprobs else None, echo=echo, tenant=gen.cache_salt, score_only=score_only,
            ))
        return out

    def grammar(self, gen: Generate, tools: list[dict[str, Any]] | None) -> str:
        """The grammar enforcing a forced tool call or a response_format, or "" when nothing is forced."""
        choice = gen.tool_choice or "auto"
        forced = tools is not None and choice != "auto"
        if not forced and gen.json_schema is None:
            return ""
        param = "tool_choice" if forced else "response_format"
        self._refuse_special_text(gen.json_schema, "response_format")
        for i, tool in enumerate(tools or ()):
            self._refuse_special_text(tool, f"tools[{i}]")
        try:
            if tools is not None and (forced or gen.json_schema is not None):
                fmt = self.rules.format
                if fmt is None or not fmt.forceable:
                    raise Refused(
                        f"this model's tool-call format ({self.rules.parser_name or 'none'}) cannot be enforced, so "
                        f"{'a forced tool_choice' if forced else 'response_format together with tools'} is not "
                        "supported for it; use tool_choice 'auto'" + ("" if forced else " without response_format"),
                        param, "unsupported_parameter")
                grammar = self.grammars.tool_grammar(fmt, tools, choice, gen.parallel_tool_calls,
                                                     None if forced else gen.json_schema)
            else:
                grammar = self.grammars.json_grammar(gen.json_schema or {})
        except GrammarError as exc:
            if exc.param:
                raise Refused(str(exc), exc.param) from None
            raise Refused(f"cannot enforce {param}: {exc}", param) from None
        return grammar

    def _refuse_special_text(self, value: Any, param: str) -> None:
        """A grammar cannot make the model spell a special token's text inside JSON (the tokenizer reads
        it as that one token, which the grammar then refuses): say so instead of ending mid-output."""
        if value is None:
            return
        text = json.dumps(value, ensure_ascii=False)
        for special in self.special_texts:
            if special in text:
                raise Refused(f"{param} contains {special!r}, the text of one of this model's special tokens, "
                              "which constrained output cannot contain; remove it", param)

class Prompter:
    """Chat template and tokenisation on rank 0, with the errors a client can cause."""

    def __init__(self, tokenizer: Any, limits: validate.Limits, grammars: Grammars, kv: KVBudget | None = None,
                 vision: Any = None, model_name: str = "this model"):
        self.tokenizer = tokenizer
        self.vision = vision  # engine/vision/prompt.py VisionPrompts, for a model that takes images
        self.model_name = model_name
        self.limits = limits
        self.context_length = limits.context_length
        self.vocab_size = limits.vocab_size
        self.admission = Admission(tokenizer, self.vocab_size, self.context_length, grammars, kv)
        self.admission.vision = vision
        self.client_text = ClientText(tokenizer)
        self.reasoning = ReasoningLevels(template_source(mlx_compat.hf_tokenizer(tokenizer)))
        # a template without tool syntax gets the tools (and a history's calls) in the messages instead
        self.renders_tools = renders_tools(lambda messages, tools: tokenizer.apply_chat_template(
            messages, tools=tools, tokenize=False, add_generation_prompt=True))
        if not self.renders_tools:
            log.info("the chat template has no tool syntax: tools are described in the system message, calls "
                     "read and enforced in the %s envelope", self.admission.rules.parser_name)

    def tokens(self, gen: Generate) -> list[int]:
        """The prompt's token ids; raises Refused."""
        if gen.kind == "chat":
            # tool_choice "none": the model is not shown the tools it may not call
            return self.chat_tokens(gen.messages, gen.tools if gen.tool_choice != "none" else None,
                                    gen.enable_thinking, reasoning_effort=gen.reasoning_effort, images=True)
        if isinstance(gen.prompt, str):
            if not gen.prompt:
                raise Refused("prompt is empty", "prompt")
            return self.tokenizer.encode(gen.prompt)
        if not gen.prompt:
            raise Refused("prompt is empty", "prompt")
        bad = [t for t in gen.prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise Refused(f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})", "prompt")
        return list(gen.prompt)

    def chat_tokens(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    enable_thinking: bool | None, *, reasoning_effort: str = "", add_generation_prompt: bool = True,
                    continue_final_message: bool = False, add_special_tokens: bool = False,
                    images: bool = False) -> list[int]:
        """The chat template's rendering of messages and tools, as token ids (images: each image's tokens take
        its own ids and its features are computed, engine/vision); raises Refused."""
        if not messages:
            raise Refused("messages must contain at least one message", "messages")
        if self.vision is None:  # a Tokenize too: validate.check refused a Generate's already
            refuse_images(messages, self.model_name)
        parts = image_parts(messages)
        options = self.reasoning.options(reasoning_effort, enable_thinking)
        if continue_final_message:
            options["continue_final_message"] = True
        try:
            # special strings a client typed (<|im_end|>...) are marked, to be encoded as text
            marked = self.client_text.marked(messages, tools)
            if marked is not None:
                messages, tools = marked
            if not self.renders_tools:
                messages = with_tools_described(messages, tools)
            text = self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **options)
        except Exception as exc:  # jinja raises arbitrary errors for bad message sequences
            raise Refused(f"the chat template rejected the messages: {exc}", "messages") from None
        if parts:
            text = self.vision.expand(text, parts)
        if marked is None:
            tokens = self.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        else:
            tokens = self.client_text.encode(text, add_special_tokens)
        return self.vision.place(tokens, parts) if parts and images else tokens

    def tokenize(self, msg: Tokenize) -> Tokenized:
        """The answer to a Tokenize: the ids a Generate of the same prompt would run; raises Refused."""
        validate.check_tokenize(msg, self.limits)
        special = msg.add_special_tokens
        if msg.kind == "chat":
            tokens = self.chat_tokens(msg.messages, msg.tools, msg.enable_thinking,
                                      reasoning_effort=msg.reasoning_effort,
                                      add_generation_prompt=msg.add_generation_prompt,
                                      continue_final_message=msg.continue_final_message,
                                      add_special_tokens=bool(special))
        else:
            tokens = self.tokenizer.encode(msg.prompt, add_special_tokens=special is not False)
        strs = self.tokenizer.convert_ids_to_tokens(tokens) if msg.return_token_strs else None
        return Tokenized(tokens=tokens, max_model_len=self.context_length, token_strs=strs)

    def detokenize(self, msg: Detokenize) -> Detokenized:
        """The text of msg's ids, special tokens included (as vLLM's /detokenize); raises Refused."""
        validate.check_detokenize(msg, self.limits)
        return Detokenized(prompt=self.tokenizer.decode(msg.tokens))


def _free_text_stop(stop: list[str], grammar: str) -> list[str]:
    """The stop strings that apply: stop strings end free text only. A grammar constrains the whole output
    (JSON, or the model's tool calls), and a stop string cutting it would break what the grammar guarantees, so
    with one they are kept out (agents send stop strings and forced calls together, as OpenAI accepts)."""
    if grammar and stop:
        log.debug("stop strings %r left out: the output is constrained by a grammar", stop)
        return []
    return list(stop)


def _special_texts(tokenizer: Any) -> list[str]:
    """The text of every token the tokenizer adds whole (<|im_end|>, <tool_call>, ...)."""
    added = getattr(mlx_compat.hf_tokenizer(tokenizer), "added_tokens_decoder", {}) or {}
    return sorted({t.content for t in added.values() if len(getattr(t, "content", "")) > 1})
