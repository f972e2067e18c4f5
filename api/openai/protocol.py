"""OpenAI request and response bodies as msgspec Structs (OpenAI names and field order).

Request structs tolerate unknown fields. Parameters we cannot honour are declared as
`Any = UNSET` so that api/openai/serving.py can refuse them by name instead of ignoring them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from api.bodies import ParamError
from api.request_fields import MaxTokens, Penalty, Seed, Temperature, TokenId, Tool, TopK, TopLogprobs, TopP


Stop = str | Annotated[list[Annotated[str, Meta(min_length=1)]], Meta(max_length=4)]
# JSON object keys are token ids as strings ("50256"); msgspec turns them into ints.
LogitBias = dict[TokenId, Annotated[float, Meta(ge=-100, le=100)]]
N = Annotated[int, Meta(ge=1, le=128)]
# legacy completions: 0 with echo scores the prompt and generates nothing (lm-evaluation-harness, vLLM)
CompletionMaxTokens = Annotated[int, Meta(ge=0)]


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


class FunctionCallIn(Struct, kw_only=True):
    name: str
    # a JSON object as text (OpenAI's shape); some clients send the object itself
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(Struct, kw_only=True):
    """A tool call of an earlier assistant message, sent back by the client."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | UnsetType = UNSET
    tool_calls: list[ToolCallIn] | UnsetType = UNSET
    tool_call_id: str | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ParamError(f"content is required for a message with role {self.role!r}", "content")
        if self.role == "tool" and self.tool_call_id is UNSET:
            raise ParamError("a message with role 'tool' needs the tool_call_id it answers", "tool_call_id")


class NamedFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class JSONSchema(Struct, kw_only=True):
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchema | UnsetType = UNSET

    def __post_init__(self) -> None:
        if self.type == "json_schema" and self.json_schema is UNSET:
            raise ParamError("type 'json_schema' needs a json_schema object", "json_schema")


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
    logprobs: bool | None = None
    max_completion_tokens: MaxTokens | None = None
    max_tokens: MaxTokens | None = None
    modalities: Any = UNSET
    n: N | None = None
    parallel_tool_calls: bool | None = None
    prediction: Any = UNSET
    presence_penalty: Penalty | None = None
    # "none" turns thinking off; serving.py checks the levels, which reach the model's chat template as it takes them
    reasoning_effort: str | None = None
    response_format: ResponseFormat | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    tool_choice: ToolChoice | None = None
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None
    top_logprobs: TopLogprobs | None = None
    top_p: TopP | None = None
    user: str | None = None
    verbosity: Any = UNSET
    web_search_options: Any = UNSET
    # non-OpenAI extensions
    top_k: TopK | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        _check_stream_options(self.stream, self.stream_options)
        if self.top_logprobs and not self.logprobs:
            raise ParamError("top_logprobs needs logprobs set to true", "top_logprobs")


class CompletionRequest(Struct, kw_only=True):
    model: str
    # A string, or token ids; api/translate.py checks the shape and refuses batches.
    prompt: str | list[Any]
    best_of: Any = UNSET
    echo: bool | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    logprobs: TopLogprobs | None = None
    max_tokens: CompletionMaxTokens | None = None
    n: N | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    suffix: Any = UNSET
    temperature: Temperature | None = None
    top_p: TopP | None = None
    user: str | None = None
    # non-OpenAI extensions
    top_k: TopK | None = None
    min_p: Annotated[float, Meta(ge=0, le=1)] | None = None
    repetition_penalty: Annotated[float, Meta(gt=0)] | None = None

    def __post_init__(self) -> None:
        _check_stream_options(self.stream, self.stream_options)
        if self.max_tokens == 0 and not self.echo:
            raise ParamError("max_tokens 0 generates nothing; it is for scoring a prompt, together with echo "
                             "(and logprobs): set echo to true, or max_tokens to at least 1", "max_tokens")


def _check_stream_options(stream: bool | None, options: StreamOptions | None) -> None:
    if options is not None and not stream:
        raise ParamError("stream_options is only allowed when stream is true", "stream_options")


# ---------------------------------------------------------------- responses


class PromptTokensDetails(Struct, kw_only=True):
    # prompt tokens whose KV the engine's prefix cache held, so they were not computed again
    cached_tokens: int = 0


class Usage(Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class TopLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(Struct, kw_only=True):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class FunctionCall(Struct, kw_only=True):
    name: str
    arguments: str


class ToolCall(Struct, kw_only=True):
    id: str
    type: str = "function"
    function: FunctionCall


class AssistantMessage(Struct, kw_only=True):
    role: str = "assistant"
    content: str | None = None
    refusal: str | None = None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    # non-OpenAI extensions: a reasoning model's thinking, under both names clients read
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET


class ChatChoice(Struct, kw_only=True):
    index: int = 0
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str


class ChatCompletion(Struct, kw_only=True):
    id: str
    object: str = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    system_fingerprint: str | None = None


class FunctionCallChunk(Struct, kw_only=True):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallChunk(Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: str | UnsetType = UNSET
    function: FunctionCallChunk


class ChunkDelta(Struct, kw_only=True):
    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[ToolCallChunk] | UnsetType = UNSET
    # non-OpenAI extensions
    reasoning_content: str | UnsetType = UNSET
    reasoning: str | UnsetType = UNSET


class ChunkChoice(Struct, kw_only=True):
    index: int = 0
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
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


class CompletionLogprobs(Struct, kw_only=True):
    tokens: list[str]
    # null for an echoed prompt's first token (nothing predicts it), as OpenAI and vLLM answer
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None] | None
    text_offset: list[int]


class CompletionChoice(Struct, kw_only=True):
    text: str
    index: int = 0
    logprobs: CompletionLogprobs | None = None
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


class EmbeddingRequest(Struct, kw_only=True):
    # a string, a list of strings, a list of token ids or a list of lists of them (checked in serving: msgspec
    # takes one list type per union)
    input: str | list[Any]
    model: str
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    user: str | UnsetType = UNSET


class Embedding(Struct, kw_only=True):
    object: str = "embedding"
    embedding: list[float] | str  # str: base64 of float32 little-endian
    index: int


class EmbeddingUsage(Struct, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(Struct, kw_only=True):
    object: str = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class Model(Struct, kw_only=True):
    id: str
    object: str = "model"
    created: int
    owned_by: str = "mlx-cluster-serve"
    # non-OpenAI extensions
    context_length: int
    # a helper model beside the served one: "embedding" or "rerank" (absent for the served model)
    kind: str | UnsetType = UNSET


class ModelList(Struct, kw_only=True):
    object: str = "list"
    data: list[Model]
