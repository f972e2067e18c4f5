"""OpenAI request -> engine Generate, and the one place that refuses what we cannot honour.

To support a parameter, drop its line from REFUSED_* and pass it on in the builder below.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec
from msgspec import UNSET

import ipc
from ipc.messages import REASONING_EFFORTS
from api.errors import InvalidRequest
from api.helpers import base64_floats, check_count, check_helper_model, floats, texts_or_tokens
from api.openai.protocol import (ChatCompletionRequest, ChatMessage, CompletionRequest, Embedding, EmbeddingList,
                                 EmbeddingRequest, EmbeddingUsage, ResponseFormat)
from api.request_checks import Refusal, check_depth, check_model, max_tokens_within, refuse_unsupported
from api.request_fields import TOKEN_ID_MAX, Tool
from api.schemas import closed
from config import Settings

REFUSED_CHAT: dict[str, Refusal] = {
    "functions": (lambda v: v in (None, []), "deprecated by OpenAI; send tools instead"),
    "function_call": (lambda v: v in (None, "none", "auto"), "deprecated by OpenAI; send tool_choice instead"),
    "audio": (lambda v: v is None, "text only"),
    "modalities": (lambda v: v is None or v == ["text"], 'only ["text"]'),
    "prediction": (lambda v: v is None, "not available"),
    "verbosity": (lambda v: v is None, "not available"),
    "web_search_options": (lambda v: v is None, "not available"),
}

REFUSED_COMPLETION: dict[str, Refusal] = {
    "best_of": (lambda v: v in (None, 1), "only best_of=1 (or equal to n)"),
    "suffix": (lambda v: v in (None, ""), "not available"),
}


def new_request_id(kind: str) -> str:
    """The OpenAI completion id, also the request id on the wire."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex}"


def chat_generate(req: ChatCompletionRequest, request_id: str, settings: Settings) -> ipc.Generate:
    check_model(req.model, settings)
    refuse_unsupported(req, REFUSED_CHAT)
    if req.max_completion_tokens is not None:
        limit, param = req.max_completion_tokens, "max_completion_tokens"
    else:
        limit, param = req.max_tokens, "max_tokens"
    tools = engine_tools(req.tools)
    return ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=_sampling(req, limit, param, settings, logprobs=bool(req.logprobs), top=req.top_logprobs or 0),
        messages=[engine_message(m) for m in req.messages],
        tools=tools,
        tool_choice=_tool_choice(req.tool_choice, tools),
        parallel_tool_calls=req.parallel_tool_calls is not False,
        json_schema=_json_schema(req.response_format),
        enable_thinking=False if req.reasoning_effort == "none" else None,
        reasoning_effort=_reasoning_effort(req.reasoning_effort),
    )


def _reasoning_effort(effort: str | None) -> str:
    """The wire's level ("" for none, or "none", which is enable_thinking off); an unknown level is a 400."""
    if effort is None or effort == "none":
        return ""
    if effort not in REASONING_EFFORTS:
        raise InvalidRequest(f"Invalid value for 'reasoning_effort': {json.dumps(effort)[:40]} is not a level this "
                             f"server knows; use one of none, {', '.join(REASONING_EFFORTS)}.",
                             param="reasoning_effort")
    return effort


def completion_generate(req: CompletionRequest, request_id: str, settings: Settings) -> ipc.Generate:
    check_model(req.model, settings)
    if req.best_of is not UNSET and req.best_of is not None and req.best_of == (req.n or 1):
        req.best_of = None  # best_of equal to n picks nothing: n plain choices
    refuse_unsupported(req, REFUSED_COMPLETION)
    if req.echo and req.logprobs is not None and (req.n or 1) > 1:
        raise InvalidRequest(
            "Unsupported parameter: 'n' above 1 together with 'echo' and 'logprobs' (the prompt's logprobs are the "
            "same for every choice); send n=1, or one request per choice.", param="n", code="unsupported_parameter")
    return ipc.Generate(
        request_id=request_id,
        kind="completion",
        params=_sampling(req, req.max_tokens, "max_tokens", settings, logprobs=req.logprobs is not None,
                         top=req.logprobs or 0),
        prompt=_engine_prompt(req.prompt),
        echo=bool(req.echo),
    )


def _tool_choice(choice: Any, tools: list[dict[str, Any]] | None) -> str | dict[str, Any] | None:
    """The wire's tool_choice; forcing a call needs tools, and a named one must be among them."""
    if choice is None:
        return None
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise InvalidRequest("Invalid value for 'tool_choice': 'required' needs tools.", param="tool_choice")
        return choice
    names = [t["function"]["name"] for t in tools or []]
    if choice.function.name not in names:
        raise InvalidRequest(
            f"Invalid value for 'tool_choice': function '{choice.function.name}' is not among the tools "
            f"({', '.join(names) or 'none given'}).", param="tool_choice")
    return msgspec.to_builtins(choice)


def _json_schema(fmt: ResponseFormat | None) -> dict[str, Any] | None:
    """The schema constrained decoding enforces: json_object is any object. With strict, as OpenAI's strict mode
    reads it, an object that declares properties allows no other key unless its additionalProperties says so;
    without, a schema means what JSON Schema says."""
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    assert fmt.json_schema is not UNSET
    schema = fmt.json_schema.schema or {}
    check_depth(schema, "response_format.json_schema.schema")
    return closed(schema) if fmt.json_schema.strict else schema


def _sampling(req: ChatCompletionRequest | CompletionRequest, limit: int | None, param: str, settings: Settings, *,
              logprobs: bool, top: int) -> ipc.SamplingParams:
    return ipc.SamplingParams(
        max_tokens=max_tokens_within(limit, param, settings),
        max_tokens_default=limit is None,
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
        n=req.n or 1,
        logprobs=logprobs,
        top_logprobs=top,
    )


def engine_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """The tools as the chat template renders them (absent fields stay absent)."""
    out = [msgspec.to_builtins(t) for t in tools] if tools else None
    for i, tool in enumerate(out or ()):
        check_depth(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
    return out


def engine_message(message: ChatMessage) -> dict[str, Any]:
    """A plain dict for the engine's chat template: text parts joined, developer read as system."""
    out = msgspec.to_builtins(message)
    if isinstance(message.content, list):
        out["content"] = "\n".join(part.text for part in message.content)  # type: ignore[misc]
    elif message.content is None:
        out["content"] = ""  # templates concatenate content; an assistant turn of only tool calls has none
    if message.role == "developer":
        out["role"] = "system"
    for call in out.get("tool_calls", ()):
        # Chat templates read arguments as a mapping (`arguments | tojson`, `arguments.items()`).
        args = call["function"]["arguments"]
        if isinstance(args, str):
            try:
                call["function"]["arguments"] = json.loads(args or "{}")
            except (json.JSONDecodeError, RecursionError):
                raise InvalidRequest("Invalid value for 'messages': a tool call's arguments are not JSON.",
                                     param="messages") from None
            check_depth(call["function"]["arguments"], "messages")
    return out


def _engine_prompt(prompt: str | list[Any]) -> str | list[int]:
    """A prompt string or a list of token ids; batches of prompts are refused (send one request each)."""
    if isinstance(prompt, str):
        if not prompt:
            raise InvalidRequest("Invalid value for 'prompt': the prompt is empty.", param="prompt")
        return prompt
    if not prompt:
        raise InvalidRequest("Invalid value for 'prompt': the prompt is empty.", param="prompt")
    if all(type(t) is int and 0 <= t <= TOKEN_ID_MAX for t in prompt):
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
        f"Invalid value for 'prompt': expected a string or a list of token ids (integers from 0 to {TOKEN_ID_MAX}).",
        param="prompt",
    )


def embed_request(req: EmbeddingRequest, request_id: str, helper: ipc.HelperState, max_inputs: int) -> ipc.Embed:
    """/v1/embeddings -> Embed. OpenAI has no truncation: an input past the model's limit is a 400 naming it."""
    check_helper_model(req.model, helper)
    inputs = texts_or_tokens(req.input, "input", tokens=True)
    check_count(len(inputs), max_inputs, "input", "input")
    dimensions = 0 if req.dimensions is UNSET else req.dimensions
    if dimensions and not helper.matryoshka:
        raise InvalidRequest(f"Invalid value for 'dimensions': {helper.name} cannot be cut to fewer dimensions (it "
                             "was not trained with Matryoshka representation learning); leave it out.", param="dimensions")
    if dimensions > helper.dimensions:
        raise InvalidRequest(f"Invalid value for 'dimensions': {dimensions} exceeds {helper.name}'s "
                             f"{helper.dimensions}.", param="dimensions")
    return ipc.Embed(request_id=request_id, inputs=inputs, dimensions=dimensions)


def embedding_list(reply: ipc.Embedded, encoding_format: str, model: str) -> EmbeddingList:
    encode = base64_floats if encoding_format == "base64" else floats
    return EmbeddingList(data=[Embedding(embedding=encode(raw), index=i) for i, raw in enumerate(reply.embeddings)],
                         model=model, usage=EmbeddingUsage(prompt_tokens=reply.prompt_tokens,
                                                           total_tokens=reply.prompt_tokens))
