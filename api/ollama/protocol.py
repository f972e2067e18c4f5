"""Ollama's /api request and response bodies as msgspec Structs (Ollama's names and field order).

Request structs tolerate unknown fields (clients send newer ones: truncate, shift, ...) and null
for any optional field, as Ollama's own server does. Options that only tune Ollama's runtime are
declared `Any` and ignored; sampling options this server cannot honour are declared `Any` too, so
api/ollama/serving.py can refuse them by name.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from api.request_fields import Penalty, Seed, TopK, TopLogprobs, TopP
from api.request_fields import Tool as Tool  # Ollama's tools are OpenAI's function tools

Think = bool | Literal["low", "medium", "high", "max"]
# "json", or a JSON schema; "" is no format
Format = Literal["", "json"] | dict[str, Any]
# seconds, or a duration such as "5m"; negative keeps the model loaded
KeepAlive = int | float | str
StopString = Annotated[str, Meta(min_length=1)]


# ---------------------------------------------------------------- requests


class Options(Struct, kw_only=True):
    """The options Ollama reads from a request; absent or null ones take this server's defaults."""

    # honoured
    num_predict: int | None = None
    temperature: Annotated[float, Meta(ge=0, le=100)] | None = None
    top_k: TopK | None = None
    top_p: TopP | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    seed: Seed | None = None
    stop: StopString | list[StopString] | None = None
    repeat_penalty: Annotated[float, Meta(ge=0.01, le=100)] | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # refused unless neutral (serving.py's REFUSED_OPTIONS)
    mirostat: Any = UNSET
    typical_p: Any = UNSET
    tfs_z: Any = UNSET
    # accepted and ignored: the engine's context, memory and threads are fixed at its start (mirostat's
    # own settings mean nothing without it; the repetition penalty looks at mlx-lm's last 20 tokens)
    mirostat_tau: Any = UNSET
    mirostat_eta: Any = UNSET
    num_ctx: Any = UNSET
    num_keep: Any = UNSET
    num_batch: Any = UNSET
    num_gpu: Any = UNSET
    main_gpu: Any = UNSET
    num_thread: Any = UNSET
    numa: Any = UNSET
    low_vram: Any = UNSET
    use_mmap: Any = UNSET
    use_mlock: Any = UNSET
    repeat_last_n: Any = UNSET
    penalize_newline: Any = UNSET


class ToolCallFunction(Struct, kw_only=True):
    name: str
    # an object (Ollama's shape); some clients send it as JSON text
    arguments: dict[str, Any] | str = {}
    index: int | None = None


class ToolCallIn(Struct, kw_only=True):
    """A tool call of an earlier assistant message, sent back by the client."""

    id: str | None = None
    function: ToolCallFunction


class Message(Struct, kw_only=True):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = ""
    thinking: str | None = None  # earlier thinking: dropped, as the chat endpoint drops reasoning sent back
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ChatRequest(Struct, kw_only=True):
    model: str
    # empty: Ollama's "load the model" call
    messages: list[Message] | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    format: Format | None = None
    options: Options | None = None
    stream: bool | None = None  # absent: true
    keep_alive: KeepAlive | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


class GenerateRequest(Struct, kw_only=True):
    model: str
    # empty: Ollama's "load the model" call
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    stream: bool | None = None  # absent: true
    raw: bool | None = None
    format: Format | None = None
    keep_alive: KeepAlive | None = None
    images: list[str] | None = None
    options: Options | None = None
    think: Think | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


class ShowRequest(Struct, kw_only=True):
    model: str | None = None
    name: str | None = None  # the field's name before Ollama renamed it to model
    verbose: bool | None = None


class EmbedRequest(Struct, kw_only=True):
    model: str
    input: str | list[Any]  # a string or a list of strings (checked in serving, naming the element)
    truncate: bool = True  # cut an input past the model's context to it; false: such an input is an error
    dimensions: Annotated[int, Meta(ge=1)] | None = None
    options: Options | None = None
    keep_alive: Any = None  # the helper never unloads


class EmbeddingsRequest(Struct, kw_only=True):
    """The legacy /api/embeddings: one prompt, one embedding."""

    model: str
    prompt: str = ""
    options: Options | None = None
    keep_alive: Any = None


# ---------------------------------------------------------------- responses


class EmbedResponse(Struct, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int = 0
    load_duration: int = 0
    prompt_eval_count: int = 0


class EmbeddingsResponse(Struct, kw_only=True):
    embedding: list[float]


class ModelDetails(Struct, kw_only=True):
    parent_model: str = ""
    format: str
    family: str
    families: list[str]
    parameter_size: str
    quantization_level: str


class ListedModel(Struct, kw_only=True):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: ModelDetails


class ModelList(Struct, kw_only=True):
    models: list[ListedModel]


class RunningModel(Struct, kw_only=True):
    name: str
    model: str
    size: int
    digest: str
    details: ModelDetails
    expires_at: str
    size_vram: int
    context_length: int


class RunningModels(Struct, kw_only=True):
    models: list[RunningModel]


class ShowResponse(Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: ModelDetails
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(Struct, kw_only=True):
    version: str


class ToolCallOutFunction(Struct, kw_only=True):
    index: int
    name: str
    arguments: dict[str, Any]


class ToolCallOut(Struct, kw_only=True):
    id: str
    function: ToolCallOutFunction


class AssistantMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str = ""
    thinking: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class TokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class Logprob(TokenLogprob, kw_only=True):
    top_logprobs: list[TokenLogprob] | UnsetType = UNSET


class ChatResponse(Struct, kw_only=True):
    """The body of a non-streamed chat, and each line of a streamed one."""

    model: str
    created_at: str
    message: AssistantMessage
    done: bool
    done_reason: str | UnsetType = UNSET
    # durations in nanoseconds; only when done
    total_duration: int | UnsetType = UNSET
    load_duration: int | UnsetType = UNSET
    prompt_eval_count: int | UnsetType = UNSET
    prompt_eval_duration: int | UnsetType = UNSET
    eval_count: int | UnsetType = UNSET
    eval_duration: int | UnsetType = UNSET
    logprobs: list[Logprob] | UnsetType = UNSET


class GenerateResponse(Struct, kw_only=True):
    """The body of a non-streamed generate, and each line of a streamed one."""

    model: str
    created_at: str
    response: str
    thinking: str | UnsetType = UNSET
    done: bool
    done_reason: str | UnsetType = UNSET
    total_duration: int | UnsetType = UNSET
    load_duration: int | UnsetType = UNSET
    prompt_eval_count: int | UnsetType = UNSET
    prompt_eval_duration: int | UnsetType = UNSET
    eval_count: int | UnsetType = UNSET
    eval_duration: int | UnsetType = UNSET
    logprobs: list[Logprob] | UnsetType = UNSET


class Error(Struct, kw_only=True):
    """Every error an /api route answers with, and a stream's last line after a failure."""

    error: str
