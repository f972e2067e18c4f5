"""OpenAI request -> engine Generate, and the one place that refuses what we cannot honour yet.

To support a parameter, drop its line from REFUSED_* and pass it on in the builder below.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET

import ipc
from api.errors import InvalidRequest, ModelNotFound
from api.schemas import ChatCompletionRequest, ChatMessage, CompletionRequest
from config import Settings

MODEL_ALIAS = "default"

# name -> (is the value harmless?, what we accept). Absent parameters are never checked.
Refusal = tuple[Callable[[Any], bool], str]

REFUSED_CHAT: dict[str, Refusal] = {
    "n": (lambda v: v in (None, 1), "only n=1"),
    "tools": (lambda v: v in (None, []), "tool calling comes in a later release"),
    "tool_choice": (lambda v: v in (None, "none", "auto"), "tool calling comes in a later release"),
    "functions": (lambda v: v in (None, []), "tool calling comes in a later release"),
    "function_call": (lambda v: v in (None, "none", "auto"), "tool calling comes in a later release"),
    "parallel_tool_calls": (lambda v: v in (None, True), "tool calling comes in a later release"),
    "response_format": (lambda v: v is None or v == {"type": "text"}, 'only {"type": "text"}'),
    "logprobs": (lambda v: v is None or v is False, "only false"),
    "top_logprobs": (lambda v: v is None or v == 0, "logprobs are not available"),
    "audio": (lambda v: v is None, "text only"),
    "modalities": (lambda v: v is None or v == ["text"], 'only ["text"]'),
    "prediction": (lambda v: v is None, "not available"),
    "reasoning_effort": (lambda v: v is None, "not available"),
    "verbosity": (lambda v: v is None, "not available"),
    "web_search_options": (lambda v: v is None, "not available"),
}

REFUSED_COMPLETION: dict[str, Refusal] = {
    "n": (lambda v: v in (None, 1), "only n=1"),
    "best_of": (lambda v: v in (None, 1), "only best_of=1"),
    "echo": (lambda v: v is None or v is False, "only false"),
    "suffix": (lambda v: v in (None, ""), "not available"),
    "logprobs": (lambda v: v is None, "logprobs are not available"),
}


def refuse_unsupported(req: msgspec.Struct, refused: dict[str, Refusal]) -> None:
    """Raise InvalidRequest naming the first parameter present with a value we cannot honour."""
    for name, (harmless, accepted) in refused.items():
        value = getattr(req, name)
        if value is not UNSET and not harmless(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise InvalidRequest(
                f"Unsupported parameter: '{name}' = {shown} is not supported by this server ({accepted}).",
                param=name,
                code="unsupported_parameter",
            )


def check_model(model: str, settings: Settings) -> None:
    """Accept the served model's name and the alias "default"; anything else is a 404."""
    if model not in (settings.model_name, MODEL_ALIAS):
        raise ModelNotFound(
            f"The model '{model}' does not exist. This server serves '{settings.model_name}' "
            f"(also reachable as '{MODEL_ALIAS}').",
            param="model",
        )


def new_request_id(kind: str) -> str:
    """The OpenAI completion id, also the request id on the wire."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def chat_generate(req: ChatCompletionRequest, request_id: str, settings: Settings) -> ipc.Generate:
    check_model(req.model, settings)
    refuse_unsupported(req, REFUSED_CHAT)
    if req.max_completion_tokens is not None:
        max_tokens = _max_tokens(req.max_completion_tokens, "max_completion_tokens", settings)
    else:
        max_tokens = _max_tokens(req.max_tokens, "max_tokens", settings)
    return ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=_sampling(req, max_tokens),
        messages=[_engine_message(m) for m in req.messages],
    )


def completion_generate(req: CompletionRequest, request_id: str, settings: Settings) -> ipc.Generate:
    check_model(req.model, settings)
    refuse_unsupported(req, REFUSED_COMPLETION)
    return ipc.Generate(
        request_id=request_id,
        kind="completion",
        params=_sampling(req, _max_tokens(req.max_tokens, "max_tokens", settings)),
        prompt=_engine_prompt(req.prompt),
    )


def _max_tokens(value: int | None, param: str, settings: Settings) -> int:
    if value is None:
        return settings.MAX_TOKENS_DEFAULT
    if value > settings.MAX_TOKENS_LIMIT:
        raise InvalidRequest(
            f"Invalid value for '{param}': {value} exceeds this server's limit of {settings.MAX_TOKENS_LIMIT}.",
            param=param,
        )
    return value


def _sampling(req: ChatCompletionRequest | CompletionRequest, max_tokens: int) -> ipc.SamplingParams:
    return ipc.SamplingParams(
        max_tokens=max_tokens,
        temperature=1.0 if req.temperature is None else req.temperature,
        top_p=1.0 if req.top_p is None else req.top_p,
        # -1 is vLLM's spelling of "no top-k"; 0 is mlx-lm's.
        top_k=0 if req.top_k is None or req.top_k < 0 else req.top_k,
        min_p=0.0 if req.min_p is None else req.min_p,
        seed=req.seed,
        stop=[req.stop] if isinstance(req.stop, str) else list(req.stop or ()),
        logit_bias=dict(req.logit_bias or {}),
        repetition_penalty=req.repetition_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
    )


def _engine_message(message: ChatMessage) -> dict[str, Any]:
    """A plain dict for the engine's chat template: text parts joined, developer read as system."""
    out = msgspec.to_builtins(message)
    if isinstance(message.content, list):
        out["content"] = "\n".join(part.text for part in message.content)  # type: ignore[misc]
    if message.role == "developer":
        out["role"] = "system"
    return out


def _engine_prompt(prompt: str | list[Any]) -> str | list[int]:
    """A prompt string or a list of token ids; batches are refused until n/batching lands."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("Invalid value for 'prompt': the prompt is empty.", param="prompt")
        return prompt
    if not prompt:
        raise InvalidRequest("Invalid value for 'prompt': the prompt is empty.", param="prompt")
    if all(type(t) is int and t >= 0 for t in prompt):
        return prompt
    if len(prompt) == 1 and isinstance(prompt[0], str):
        return _engine_prompt(prompt[0])
    if all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        raise InvalidRequest(
            "Unsupported parameter: batch prompts (several prompts in one request) are not supported by this server.",
            param="prompt",
            code="unsupported_parameter",
        )
    raise InvalidRequest(
        "Invalid value for 'prompt': expected a string or a list of token ids (non-negative integers).",
        param="prompt",
    )
