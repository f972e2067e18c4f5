"""OpenAI request and response bodies as msgspec Structs (OpenAI names and field order).

Request structs tolerate unknown fields. Parameters we cannot honour yet are declared as
`Any = UNSET` so that api/translate.py can refuse them by name instead of ignoring them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType


class ParamError(ValueError):
    """A cross-field rule failed in __post_init__; param names the field, relative to the struct."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
MaxTokens = Annotated[int, Meta(ge=1)]
Stop = str | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=4)]
# JSON object keys are token ids as strings ("50256"); msgspec turns them into ints.
LogitBias = dict[Annotated[int, Meta(ge=0)], Annotated[float, Meta(ge=-100, le=100)]]


# ---------------------------------------------------------------- requests


class ContentPart(Struct, kw_only=True):
    """One part of a message's content; only text parts are supported."""

    type: str
    text: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.type == "image_url":
            raise ParamError("images are not supported", "type")
        if self.type != "text":
            raise ParamError(f"content parts of type {self.type!r} are not supported; use 'text'", "type")
        if self.text is UNSET:
            raise ParamError("a text content part needs a 'text' field", "text")


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ParamError(f"content is required for a message with role {self.role!r}", "content")


class StreamOptions(Struct, kw_only=True):
    include_usage: bool | None = None


class ChatCompletionRequest(Struct, kw_only=True):
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    model: str
    audio: Any = UNSET
    frequency_penalty: Penalty | None = None
    function_call: Any = UNSET
    functions: Any = UNSET
    logit_bias: LogitBias | None = None
    logprobs: Any = UNSET
    max_completion_tokens: MaxTokens | None = None
    max_tokens: MaxTokens | None = None
    modalities: Any = UNSET
    n: Annotated[int, Meta(ge=1)] | None = None
    parallel_tool_calls: Any = UNSET
    prediction: Any = UNSET
    presence_penalty: Penalty | None = None
    reasoning_effort: Any = UNSET
    response_format: Any = UNSET
    seed: int | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    tool_choice: Any = UNSET
    tools: Any = UNSET
    top_logprobs: Any = UNSET
    top_p: TopP | None = None
    user: str | None = None
    verbosity: Any = UNSET
    web_search_options: Any = UNSET
    # non-OpenAI extensions
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        _check_stream_options(self.stream, self.stream_options)


class CompletionRequest(Struct, kw_only=True):
    model: str
    # A string, or token ids; api/translate.py checks the shape and refuses batches.
    prompt: str | list[Any]
    best_of: Any = UNSET
    echo: Any = UNSET
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    logprobs: Any = UNSET
    max_tokens: MaxTokens | None = None
    n: Annotated[int, Meta(ge=1)] | None = None
    presence_penalty: Penalty | None = None
    seed: int | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: Any = UNSET
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    # non-OpenAI extensions
    top_k: Annotated[int, Meta(ge=-1)] | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        _check_stream_options(self.stream, self.stream_options)


def _check_stream_options(stream: bool | None, options: StreamOptions | None) -> None:
    if options is not None and not stream:
        raise ParamError("stream_options is only allowed when stream is true", "stream_options")


# ---------------------------------------------------------------- responses


class Usage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AssistantMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    refusal: str | None = None


class ChatChoice(Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: None = None
    finish_reason: str


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class ChunkDelta(Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET


class ChunkChoice(Struct, kw_only=True):
    index: int = 0
    delta: ChunkDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(Struct, kw_only=True):
    id: str
    object: str = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[ChunkChoice]
    # null on every chunk but the last when stream_options.include_usage; absent otherwise
    usage: Usage | None | UnsetType = UNSET


class CompletionChoice(Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: None = None
    finish_reason: str | None = None


class Completion(Struct, kw_only=True):
    """Both the non-streaming body and each streamed chunk of /v1/completions."""

    id: str
    object: str = "text_completion"
    created: int
    model: str
    system_fingerprint: str | None = None
    choices: list[CompletionChoice]
    usage: Usage | None | UnsetType = UNSET


class Model(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "mlx-cluster-serve"
    # non-OpenAI extensions
    context_length: int


class ModelList(Struct, kw_only=True):
    object: str = "list"
    data: list[Model]


def encode(obj: Any) -> bytes:
    """JSON bytes of a response struct or plain value."""
    return _encoder.encode(obj)


_encoder = msgspec.json.Encoder()
