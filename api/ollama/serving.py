"""Ollama /api/chat and /api/generate requests -> the same engine Generate the chat endpoint sends.

Messages become OpenAI-shaped chat messages (tool-call arguments as objects, as chat templates read
them), tools stay OpenAI function tools, `format` becomes the schema constrained decoding enforces,
so one conversation gives one prompt (and the same greedy tokens) through /api/chat and
/v1/chat/completions. A raw /api/generate is a completion of the prompt as it is.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import msgspec

import ipc
from api.errors import InvalidRequest, ModelNotFound
from api.helpers import check_count, check_helper_model, texts_or_tokens
from api.ollama.protocol import (ChatRequest, EmbeddingsRequest, EmbedRequest, Format, GenerateRequest, Message, Options,
                                 Think)
from api.request_checks import MODEL_ALIAS, Refusal, check_depth, max_tokens_within, server_max_tokens
from api.schemas import closed
from config import Settings

# Ollama names a model "name:tag"; a name without a tag means ":latest"
LATEST = ":latest"

# option -> (is the value harmless?, what we accept); sampling this server's sampler cannot do
REFUSED_OPTIONS: dict[str, Refusal] = {
    "mirostat": (lambda v: v in (None, 0), "only 0: mirostat sampling is not available"),
    "typical_p": (lambda v: v in (None, 1), "only 1.0: typical sampling is not available"),
    "tfs_z": (lambda v: v in (None, 1), "only 1.0: tail-free sampling is not available"),
}


def new_request_id() -> str:
    """The request id on the wire and in the logs (Ollama's bodies carry none)."""
    return f"ollama-{uuid.uuid4().hex}"


def served(model: str, settings: Settings) -> bool:
    """The served model's name or the alias "default", with or without Ollama's ":latest" tag."""
    names = {settings.model_name, MODEL_ALIAS}
    return model in names or model.removesuffix(LATEST) in names or model + LATEST in names


def check_model(model: str, settings: Settings) -> None:
    if not served(model, settings):
        raise ModelNotFound(f"model '{model}' not found: this server serves '{settings.model_name}' "
                            f"(also reachable as '{MODEL_ALIAS}')", param="model")


def chat_generate(req: ChatRequest, request_id: str, settings: Settings) -> ipc.Generate:
    """The engine request of a chat with messages (an empty one is a load call, answered without one)."""
    check_model(req.model, settings)
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    for i, tool in enumerate(tools or ()):
        check_depth(tool["function"].get("parameters"), f"tools[{i}].function.parameters")
    return ipc.Generate(
        request_id=request_id,
        kind="chat",
        params=sampling(req.options, settings, req.logprobs, req.top_logprobs),
        messages=engine_messages(req.messages or []),
        tools=tools,
        json_schema=json_schema(req.format),
        enable_thinking=thinking(req.think),
        reasoning_effort=effort(req.think),
    )


def generate_generate(req: GenerateRequest, request_id: str, settings: Settings) -> ipc.Generate:
    """The engine request of a prompt: a user message (after the system, if any), or with raw the text itself."""
    check_model(req.model, settings)
    _refuse_generate_fields(req)
    params = sampling(req.options, settings, req.logprobs, req.top_logprobs)
    if req.raw:
        if req.system:
            raise InvalidRequest("Invalid value for 'system': raw mode does not support a system prompt; put it "
                                 "in the prompt yourself, or drop raw.", param="system")
        return ipc.Generate(request_id=request_id, kind="completion", params=params, prompt=req.prompt or "",
                            json_schema=json_schema(req.format))
    messages = [{"role": "system", "content": req.system}] if req.system else []
    messages.append({"role": "user", "content": req.prompt or ""})
    return ipc.Generate(request_id=request_id, kind="chat", params=params, messages=messages,
                        json_schema=json_schema(req.format), enable_thinking=thinking(req.think),
                        reasoning_effort=effort(req.think))


def _refuse_generate_fields(req: GenerateRequest) -> None:
    if req.suffix:
        raise InvalidRequest("Unsupported parameter: 'suffix' (fill in the middle) is not supported by this server; "
                             "send the text before the gap as the prompt.", param="suffix", code="unsupported_parameter")
    if req.template:
        raise InvalidRequest("Unsupported parameter: 'template' is not supported by this server: prompts are "
                             "rendered by the model's own chat template; template the prompt yourself and send it "
                             "with raw: true.", param="template", code="unsupported_parameter")
    if req.context:
        raise InvalidRequest("Unsupported parameter: 'context' (deprecated by Ollama) is not supported by this "
                             "server; send the conversation to /api/chat instead.", param="context",
                             code="unsupported_parameter")
    if req.images:
        raise _no_images("images")


def _no_images(param: str) -> InvalidRequest:
    return InvalidRequest(f"Unsupported parameter: '{param}': images are not supported by this server (text only).",
                          param=param, code="unsupported_parameter")


def sampling(options: Options | None, settings: Settings, logprobs: bool | None,
             top_logprobs: int | None) -> ipc.SamplingParams:
    """Ollama's options as the engine's sampling; absent ones take the chat endpoint's defaults."""
    o = options or Options()
    for name, (harmless, accepted) in REFUSED_OPTIONS.items():
        value = getattr(o, name)
        if value is not msgspec.UNSET and not harmless(value):
            raise InvalidRequest(f"Unsupported parameter: 'options.{name}' = {json.dumps(value)[:40]} is not "
                                 f"supported by this server ({accepted}).", param=f"options.{name}",
                                 code="unsupported_parameter")
    stop = o.stop if isinstance(o.stop, list) else [o.stop] if o.stop else []
    return ipc.SamplingParams(
        max_tokens=_max_tokens(o.num_predict, settings),
        max_tokens_default=o.num_predict in (None, -1, -2),
        temperature=1.0 if o.temperature is None else o.temperature,
        top_p=1.0 if o.top_p is None else o.top_p,
        top_k=0 if o.top_k is None or o.top_k < 0 else o.top_k,
        min_p=0.0 if o.min_p is None else o.min_p,
        # Ollama's -1 is "a random seed"
        seed=None if o.seed in (None, -1) else o.seed,
        stop=stop,
        repetition_penalty=o.repeat_penalty,
        presence_penalty=o.presence_penalty,
        frequency_penalty=o.frequency_penalty,
        logprobs=bool(logprobs),
        # Ollama applies top_logprobs only with logprobs
        top_logprobs=(top_logprobs or 0) if logprobs else 0,
    )


def _max_tokens(num_predict: int | None, settings: Settings) -> int:
    """Absent, Ollama's -1 (no limit) and -2 (fill the context): as many as the context and the KV budget allow
    (server_max_tokens), as on /v1."""
    if num_predict in (-1, -2):
        return server_max_tokens(settings)
    if num_predict is not None and num_predict < 1:
        raise InvalidRequest(f"Invalid value for 'options.num_predict': {num_predict}; send a number of tokens "
                             "(1 or more), or -1 for as many as this server allows.", param="options.num_predict")
    return max_tokens_within(num_predict, "options.num_predict", settings)


def thinking(think: Think | None) -> bool | None:
    """think switches the chat template's enable_thinking; a level ("low", ...) is on, and reaches the templates
    that take a level too (effort)."""
    if think is None:
        return None
    return think if isinstance(think, bool) else True


def effort(think: Think | None) -> str:
    """A think level as the engine's reasoning level ("" for a switch or none)."""
    return think if isinstance(think, str) else ""


def json_schema(fmt: Format | None) -> dict[str, Any] | None:
    """format "json" is any object; "" is no format; a schema is enforced as Ollama reads it: an object that
    declares properties allows no other key unless its additionalProperties says so."""
    if not fmt:
        return None
    if fmt == "json":
        return {"type": "object"}
    assert isinstance(fmt, dict)
    check_depth(fmt, "format")
    return closed(fmt)


def engine_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """The conversation in the chat template's (OpenAI) shape: tool calls get ids, tool results the id they answer."""
    out: list[dict[str, Any]] = []
    unanswered: list[tuple[str, str]] = []  # (id, name) of the last assistant turn's calls
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if m.images:
            raise _no_images(f"{where}.images")
        message: dict[str, Any] = {"role": m.role, "content": m.content or ""}
        if m.role == "assistant" and m.tool_calls:
            message["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]", f"call_{i}_{j}")
                                     for j, c in enumerate(m.tool_calls)]
            unanswered = [(c["id"], c["function"]["name"]) for c in message["tool_calls"]]
        elif m.role == "tool":
            answered = _answered(m, unanswered)
            if answered:
                message["tool_call_id"] = answered
        out.append(message)
    return out


def _tool_call(call: Any, where: str, default_id: str) -> dict[str, Any]:
    args = call.function.arguments
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except (json.JSONDecodeError, RecursionError):
            args = None
        if not isinstance(args, dict):
            raise InvalidRequest(f"Invalid value for '{where}.function.arguments': send a JSON object.",
                                 param=f"{where}.function.arguments")
    check_depth(args, f"{where}.function.arguments")
    # a stable id when the client sends none: the same history renders the same prompt every turn
    return {"id": call.id or default_id, "type": "function", "function": {"name": call.function.name,
                                                                          "arguments": args}}


def _answered(m: Message, unanswered: list[tuple[str, str]]) -> str | None:
    """The call a tool message answers: its tool_call_id, else the first open call of its tool_name, else the first."""
    if m.tool_call_id:
        picked = next((c for c in unanswered if c[0] == m.tool_call_id), None)
        if picked:
            unanswered.remove(picked)
        return m.tool_call_id
    picked = next((c for c in unanswered if c[1] == m.tool_name), unanswered[0] if unanswered else None)
    if picked is None:
        return None
    unanswered.remove(picked)
    return picked[0]


def embed_request(req: EmbedRequest, request_id: str, helper: ipc.HelperState, max_inputs: int) -> ipc.Embed | None:
    """/api/embed -> Embed; None for an empty input, which Ollama answers with no embeddings (it loads the model)."""
    check_helper_model(req.model, helper)
    if req.input in ("", []):
        return None
    inputs = texts_or_tokens(req.input, "input", tokens=False)
    check_count(len(inputs), max_inputs, "input", "input")
    dimensions = req.dimensions or 0
    if dimensions and (not helper.matryoshka or dimensions > helper.dimensions):
        why = (f"it has {helper.dimensions}" if helper.matryoshka else
               "it was not trained to be cut to fewer dimensions; leave dimensions out")
        raise InvalidRequest(f"dimensions {dimensions} is not available for {helper.name}: {why}", param="dimensions")
    return ipc.Embed(request_id=request_id, inputs=inputs, truncate=req.truncate, dimensions=dimensions)


def embeddings_request(req: EmbeddingsRequest, request_id: str, helper: ipc.HelperState) -> ipc.Embed | None:
    """The legacy /api/embeddings -> Embed of its one prompt (cut to the context, as Ollama did); None: empty."""
    check_helper_model(req.model, helper)
    if not req.prompt:
        return None
    return ipc.Embed(request_id=request_id, inputs=[req.prompt], truncate=True, param="prompt")
