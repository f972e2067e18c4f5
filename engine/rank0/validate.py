"""Rank 0's trust boundary: every Generate is checked against the loaded model before it can reach a plan
(and every Tokenize and Detokenize before the tokenizer sees it).

The socket's schema only says what types a message has; this says which values the engine can run.
A value that passes here must never raise inside a batched step (where it would fail on every rank).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

import msgspec

from ipc import Detokenize, Generate, SamplingParams, Tokenize
from ipc.messages import REASONING_EFFORTS

from engine.rank0.errors import Refused
from engine.vision.parts import refuse_images

# What one request may ask for, whatever the API in front allows.
MAX_CHOICES = 128
MAX_TOP_LOGPROBS = 20
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 1024
MAX_LOGIT_BIAS = 100.0
MAX_PENALTY = 2.0  # presence/frequency: OpenAI's range
MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY = 0.01, 100.0
# The sampler divides log probabilities by the temperature: below MIN_TEMPERATURE even the likeliest
# token's overflows to -inf (every token then looks alike, grammar masks included), so that is greedy;
# past MAX_TEMPERATURE the division underflows and a masked token's -inf becomes NaN.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
MAX_TOOLS = 128
# Choice i > 0 of request r runs as "r/i": a slash in an id could collide with another request's choice.
REQUEST_ID = re.compile(r"[A-Za-z0-9_.:\-]{1,128}")
TOOL_CHOICES = ("none", "auto", "required")


@dataclass(frozen=True)
class Limits:
    """What the loaded model and the engine's configuration allow."""

    vocab_size: int  # token ids the tokenizer knows (prompts, logit_bias)
    logits_size: int  # rows of the model's output (top_k beyond it keeps every token)
    context_length: int
    max_batch: int
    max_queue: int
    vision: bool = False  # the model takes images (engine/vision)
    model: str = "this model"  # its name, for the refusal of an image it cannot take

    @property
    def capacity(self) -> int:
        """Sequences the engine can hold at once: running plus waiting."""
        return self.max_batch + self.max_queue


def check(gen: Generate, limits: Limits) -> Generate:
    """The request as the engine will run it; raises Refused naming the first value it cannot run."""
    if not REQUEST_ID.fullmatch(gen.request_id):
        raise Refused(f"request_id {_show(gen.request_id)} is not valid: use 1 to 128 letters, digits or "
                      "'_.:-' (no '/', which names the choices of a request)", "request_id")
    params = _sampling(gen.params, limits, echo=gen.echo and gen.kind == "completion")
    if gen.kind == "chat":
        _messages(gen.messages, limits)
        _tools(gen.tools, gen.tool_choice)
        _json_only(gen.tools, "tools")
        _reasoning_effort(gen.reasoning_effort)
    _json_only(gen.json_schema, "response_format")
    if params is not gen.params:
        gen = msgspec.structs.replace(gen, params=params)
    return gen


def check_tokenize(msg: Tokenize, limits: Limits) -> None:
    """A chat is checked as a Generate's chat would be; raises Refused."""
    if msg.kind == "chat":
        _messages(msg.messages, limits)
        _tools(msg.tools, None)
        _json_only(msg.tools, "tools")
        _reasoning_effort(msg.reasoning_effort)
        if msg.continue_final_message and msg.add_generation_prompt:
            raise Refused("continue_final_message and add_generation_prompt cannot both be true: continue the "
                          "last message, or start the assistant's turn after it", "continue_final_message")


def _reasoning_effort(effort: str) -> None:
    if effort and effort not in REASONING_EFFORTS:
        raise Refused(f"reasoning_effort {_show(effort)} is not a level this server knows; use one of "
                      f"{', '.join(REASONING_EFFORTS)} (or none)", "reasoning_effort")


def check_detokenize(msg: Detokenize, limits: Limits) -> None:
    """Ids within the vocabulary, at most a context's worth of them (vLLM's bound); raises Refused."""
    if len(msg.tokens) > limits.context_length:
        raise Refused(f"tokens has {len(msg.tokens)} ids, more than this model's context length of "
                      f"{limits.context_length}; detokenize at most that many at a time", "tokens")
    if msg.tokens and (min(msg.tokens) < 0 or max(msg.tokens) >= limits.vocab_size):
        i, token = next((i, t) for i, t in enumerate(msg.tokens) if not 0 <= t < limits.vocab_size)
        raise Refused(f"tokens[{i}] is {token}, outside the vocabulary (0..{limits.vocab_size - 1})",
                      f"tokens[{i}]")


def _sampling(p: SamplingParams, limits: Limits, echo: bool = False) -> SamplingParams:
    if p.max_tokens < (0 if echo else 1):
        raise Refused(f"max_tokens must be at least 1 (0 only for a completion with echo), got {p.max_tokens}",
                      "max_tokens")
    if not 1 <= p.n <= MAX_CHOICES:
        raise Refused(f"n must be from 1 to {MAX_CHOICES}, got {p.n}", "n")
    if p.n > limits.capacity:
        raise Refused(f"n={p.n} choices can never be scheduled: this engine holds at most {limits.capacity} "
                      f"sequences (MAX_BATCH={limits.max_batch} running + MAX_QUEUE={limits.max_queue} waiting); "
                      "ask for fewer choices", "n")
    _finite_in("temperature", p.temperature, 0.0, MAX_TEMPERATURE)
    if not (math.isfinite(p.top_p) and 0.0 < p.top_p <= 1.0):
        raise Refused(f"top_p must be greater than 0 and at most 1, got {p.top_p}", "top_p")
    _finite_in("min_p", p.min_p, 0.0, 1.0)
    if p.top_k < 0:
        raise Refused(f"top_k must be 0 (no limit) or a positive number of tokens, got {p.top_k}", "top_k")
    if p.repetition_penalty is not None:
        # beyond these the penalised logits overflow to inf and the row to NaN
        _finite_in("repetition_penalty", p.repetition_penalty, MIN_REPETITION_PENALTY, MAX_REPETITION_PENALTY)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(p, name)
        if value is not None:
            _finite_in(name, value, -MAX_PENALTY, MAX_PENALTY)
    for token, bias in p.logit_bias.items():
        if not 0 <= token < limits.vocab_size:
            raise Refused(f"logit_bias names token id {token}, outside the vocabulary (0..{limits.vocab_size - 1})",
                          "logit_bias")
        _finite_in("logit_bias", bias, -MAX_LOGIT_BIAS, MAX_LOGIT_BIAS)
    if not 0 <= p.top_logprobs <= MAX_TOP_LOGPROBS:
        raise Refused(f"top_logprobs must be from 0 to {MAX_TOP_LOGPROBS}, got {p.top_logprobs}", "top_logprobs")
    if len(p.stop) > MAX_STOP_STRINGS:
        raise Refused(f"at most {MAX_STOP_STRINGS} stop strings, got {len(p.stop)}", "stop")
    for s in p.stop:
        if not 0 < len(s) <= MAX_STOP_CHARS:
            raise Refused(f"a stop string must have 1 to {MAX_STOP_CHARS} characters, got {len(s)}", "stop")
    changes: dict[str, Any] = {}
    if 0.0 < p.temperature < MIN_TEMPERATURE:
        changes["temperature"] = 0.0
    if p.top_k >= limits.logits_size:
        changes["top_k"] = 0  # keeping at least every token is no filter at all (mlx-lm would raise)
    if p.top_logprobs > limits.logits_size:
        changes["top_logprobs"] = limits.logits_size
    return msgspec.structs.replace(p, **changes) if changes else p


def _finite_in(name: str, value: float, low: float, high: float) -> None:
    if not (math.isfinite(value) and low <= value <= high):
        span = f"at least {low:g}" if high == math.inf else f"from {low:g} to {high:g}"
        raise Refused(f"{name} must be a finite number {span}, got {value}", name)


def _messages(messages: list[dict[str, Any]], limits: Limits) -> None:
    for i, m in enumerate(messages):
        if not isinstance(m.get("role"), str):
            raise Refused(f"messages[{i}] needs a string 'role'", f"messages[{i}].role")
    if not limits.vision:  # its chat template would drop or garble an image unseen
        refuse_images(messages, limits.model)


def _tools(tools: list[dict[str, Any]] | None, choice: Any) -> None:
    names = []
    if tools is not None:
        if len(tools) > MAX_TOOLS:
            raise Refused(f"at most {MAX_TOOLS} tools, got {len(tools)}", "tools")
        for i, tool in enumerate(tools):
            fn = tool.get("function")
            if tool.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str) \
                    or not fn["name"]:
                raise Refused(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}",
                              f"tools[{i}]")
            if not isinstance(fn.get("parameters", {}), dict):
                raise Refused(f"tools[{i}].function.parameters must be a JSON schema object",
                              f"tools[{i}].function.parameters")
            names.append(fn["name"])
    if choice is None or choice in TOOL_CHOICES:
        if choice == "required" and not names:
            raise Refused("tool_choice 'required' needs tools", "tool_choice")
        return
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or name not in names:
        raise Refused(f"tool_choice must be one of {', '.join(TOOL_CHOICES)} or {{\"type\": \"function\", "
                      f"\"function\": {{\"name\": <one of the tools>}}}}; tools: {', '.join(names) or 'none'}",
                      "tool_choice")


def _json_only(value: Any, param: str) -> None:
    """Schemas become grammar text through json.dumps: values JSON cannot hold (msgpack bytes) are refused."""
    try:
        json.dumps(value, allow_nan=False)  # a NaN or an infinity compiles into a grammar nothing satisfies
    except (TypeError, ValueError, RecursionError) as exc:
        raise Refused(f"{param} must hold only JSON values ({type(exc).__name__}: {str(exc)[:80]})", param) from None


def _show(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:37] + "...")
