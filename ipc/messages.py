"""Message schemas of the API <-> engine socket: one tagged union, validated by msgspec."""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

# Bump when a message changes incompatibly; both sides refuse a peer with another version.
PROTOCOL_VERSION = 10


# The reasoning levels a Generate may ask for (OpenAI's reasoning_effort but "none", which is enable_thinking false).
REASONING_EFFORTS = ("minimal", "low", "medium", "high", "xhigh", "max")


class Msg(
    msgspec.Struct,
    tag_field="type",
    tag=str.lower,
    frozen=True,
    kw_only=True,
    forbid_unknown_fields=True,
):
    """Base of every message on the socket."""


class Hello(Msg):
    """First frame a client sends: the protocol version it speaks."""

    version: int
    client: str = ""


class Welcome(Msg):
    """The engine's answer to a matching Hello."""

    version: int
    engine_pid: int = 0


class InfoRequest(Msg):
    """Asks the engine for its model, topology and live state."""


class RankState(msgspec.Struct, frozen=True, kw_only=True):
    """What one rank last reported about itself."""

    rank: int
    host: str = ""
    pid: int = 0
    step: int = 0
    active_memory: int = 0
    peak_memory: int = 0
    cache_memory: int = 0
    host_memory_total: int = 0
    host_memory_available: int = 0
    # KV bytes this rank's shard of the prefix cache holds
    prompt_cache_bytes: int = 0
    report_age: float = 0.0
    # seconds rank 0 has been waiting for this rank to answer a report request (0: it answered)
    unanswered: float = 0.0
    # bytes Metal lets this host's GPU wire (its recommended working set); 0: no such limit (not a Mac)
    gpu_working_set: int = 0
    # weights of the helper models (embeddings, rerank) pinned on this rank, inside active_memory
    helper_bytes: int = 0


class LinkState(msgspec.Struct, frozen=True, kw_only=True):
    """The last probe of the link between ranks a and b (a < b), measured by rank a while the engine was idle."""

    a: int
    b: int
    host_a: str = ""
    host_b: str = ""
    # half the median round trip of a one-byte send/recv between the two ranks
    latency_seconds: float = 0.0
    # bytes per second of one send of probe_bytes from a to b answered by one byte, the fastest one-byte round trip
    # taken out (at most half the time)
    bandwidth_bytes_per_second: float = 0.0
    # what the probe of this link cost: its bytes (one way) and seconds
    probe_bytes: int = 0
    probe_seconds: float = 0.0
    measured_at: float = 0.0  # unix time
    age: float = 0.0  # seconds since measured, when the Info was made


class ModelFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the loaded model is, read once from its files at load (for clients that ask: Ollama's /api/show)."""

    architecture: str = ""  # config.json's model_type, e.g. "qwen3"
    parameters: int = 0  # weights counted from the safetensors headers, unpacked from quantization
    weight_bytes: int = 0  # the safetensors files on disk
    quantization_bits: int = 0  # 0: not quantized
    quantization_mode: str = ""  # mlx's mode: "affine", "mxfp4", ...
    dtype: str = ""  # config.json's torch_dtype (or dtype)
    # config.json's top-level numbers and strings (hidden_size, num_hidden_layers, ...)
    config: dict[str, int | float | str | bool] = {}
    chat_template: str = ""
    thinking: bool = False  # the tokenizer knows think markers
    tool_calling: bool = False  # the tokenizer knows tool-call markers
    vision: bool = False  # the model takes images (a vision-language model whose tower the engine loaded)


class HelperState(msgspec.Struct, frozen=True, kw_only=True):
    """A helper model loaded beside the served one (EMBEDDING_MODEL, RERANK_MODEL), outside its lockstep plan."""

    kind: Literal["embedding", "rerank"]
    name: str
    rank: int = 0
    path: str = ""
    family: str = ""  # its module under engine/helpers/families
    max_tokens: int = 0  # the longest input (a rerank: query and document together) it takes
    dimensions: int = 0  # embedding width (0 for rerank)
    matryoshka: bool = False  # an embedding may be cut to fewer dimensions
    weight_bytes: int = 0


class Info(Msg):
    """Model, topology and live state of the engine."""

    model: str
    model_path: str
    context_length: int
    ranks: int
    backend: str
    created: int
    engine_pid: int
    uptime: float = 0.0
    step: int = 0
    last_step_age: float = 0.0
    active: int = 0
    queued: int = 0
    max_batch: int = 0
    max_queue: int = 0
    rank_states: list[RankState] = []
    # cumulative since the engine started (Prometheus rates them): forward steps and plan broadcasts
    step_time_sum: float = 0.0
    step_time_count: int = 0
    broadcast_time_sum: float = 0.0
    broadcast_time_count: int = 0
    # the prefix cache (rank 0's view; per-rank bytes are in rank_states): budget per rank (0: off), what it
    # holds, and cumulative counts since the engine started
    prompt_cache_budget: int = 0
    prompt_cache_bytes: int = 0
    prompt_cache_entries: int = 0
    prompt_cache_hits: int = 0
    prompt_cache_misses: int = 0
    prompt_cache_evictions: int = 0
    # the prefix cache's disk tier: rank 0's files, its cap (0: off), and rank 0's restores from it
    prompt_cache_disk_entries: int = 0
    prompt_cache_disk_bytes: int = 0
    prompt_cache_disk_cap_bytes: int = 0
    prompt_cache_disk_hits: int = 0
    prompt_cache_disk_restores: int = 0
    prompt_cache_disk_restore_failures: int = 0
    prompt_cache_disk_writes: int = 0  # rank 0's files written, and evicted under the cap
    prompt_cache_disk_evictions: int = 0
    prompt_cache_disk_bytes_restored: int = 0  # over seconds_restoring: the restore rate
    prompt_cache_disk_seconds_restoring: float = 0.0
    # prompt tokens of every sequence that joined the batch, and how many of them came from the cache
    prompt_tokens_total: int = 0
    prompt_tokens_cached: int = 0
    # arrays (Metal buffers) the batch and the prefix cache hold on rank 0, as of the last store or eviction, and
    # the most the prefix cache may bring them to (MAX_LIVE_BUFFERS; 0: no cap)
    live_buffers: int = 0
    live_buffers_budget: int = 0
    # KV memory per rank (rank 0's estimate, from the largest rank's measured caches): the budget of the running
    # sequences and the prefix cache together (0: no limit), what the running sequences reserve, one token's KV
    # in the layers that keep every token, one token's in sliding-window layers and the window they keep, and
    # the state a sequence holds whatever its length (linear attention)
    kv_budget_bytes: int = 0
    kv_reserved_bytes: int = 0
    kv_token_bytes: int = 0
    kv_window_token_bytes: int = 0
    kv_window: int = 0
    kv_constant_bytes: int = 0
    # False: some rank could not measure its caches, and one token's KV comes from the model's config
    kv_measured: bool = False
    # how keys and values are stored (KV_BITS, KV_GROUP_SIZE): kv_bits 0 in the model's float type, else packed in
    # kv_bits with a scale and a bias per kv_group_size; for people "bf16" or "8-bit, group 64" ("" from an engine
    # older than these fields)
    kv_precision: str = ""
    kv_bits: int = 0
    kv_group_size: int = 0
    # None from an engine older than this field
    facts: ModelFacts | None = None
    # how the ranks split the model: "tensor" (each holds a slice of every layer), "pipeline" (each holds whole
    # layers: pipeline_layers per rank, rank 0 first), "single" (one rank; "" from an engine older than this field)
    parallel: str = ""
    pipeline_layers: list[int] = []
    # why the ranks run in this mode rather than tensor parallel when PARALLEL=auto chose it ("": tensor, or asked)
    parallel_note: str = ""
    # the links between ranks as last probed (empty: one rank, or no probe yet)
    links: list[LinkState] = []
    # speculative decoding (SPECULATIVE; "off" also where the model's caches cannot verify drafts), the most draft
    # tokens per sequence and step, and cumulative counts: draft tokens proposed and accepted, and a sequence's
    # forward passes that verified drafts (a step verifying three sequences' drafts counts three) with the tokens
    # those sequences gained in them, so emitted / forward passes is tokens per target forward pass (1.0 without)
    spec_mode: str = "off"
    spec_draft_tokens: int = 0
    spec_proposed_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_forward_passes: int = 0
    spec_emitted_tokens: int = 0
    # prompt tokens one step prefills (PREFILL_TOKENS_PER_STEP, or less where the slowest rank's measured rate,
    # in tokens per second, would bring a step near WATCHDOG_TIMEOUT; 0 from an engine older than these fields)
    prefill_chunk: int = 0
    prefill_tokens_per_second: float = 0.0
    # positions the decoding forward passes computed, every row padded to the step's widest draft (with SPECULATIVE)
    spec_decode_positions: int = 0
    # MCS_TEST_HOOKS=1 on rank 0: the test-only fault hooks (ipc/test_hooks.py) are read
    test_hooks: bool = False
    # helper models beside the served one; helper work so far: inputs embedded or scored, their tokens, seconds
    helpers: list[HelperState] = []
    helper_inputs: int = 0
    helper_tokens: int = 0
    helper_seconds: float = 0.0


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How to pick tokens for one request; identical on every rank."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: list[str] = []
    logit_bias: dict[int, float] = {}
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    # choices sampled from the one prompt (OpenAI's n); each is its own sequence in the batch
    n: int = 1
    # per-token logprobs, and how many alternatives each (chat: top_logprobs; completions: logprobs)
    logprobs: bool = False
    top_logprobs: int = 0
    # the client set no limit: max_tokens is the server's own ceiling, which the engine lowers to what the
    # context and the KV budget leave instead of refusing the request
    max_tokens_default: bool = False


class Generate(Msg):
    """Start one generation; the connection then carries its events until Finish or Error."""

    request_id: str
    kind: Literal["chat", "completion"]
    params: SamplingParams
    # chat: OpenAI-shaped messages, rendered by the engine's chat template
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    # completion: raw prompt text, or token ids
    prompt: str | list[int] = ""
    echo: bool = False
    # "none" | "auto" | "required" | {"type": "function", "function": {"name": ...}}
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    # a JSON schema the output must match, enforced by constrained decoding (json_object: {"type": "object"})
    json_schema: dict[str, Any] | None = None
    # chat template switch for reasoning models; None leaves the template's default
    enable_thinking: bool | None = None
    # a reasoning level (one of REASONING_EFFORTS, "": none asked), passed to templates that take one and read as
    # thinking on (off for "minimal") by templates with only a switch
    reasoning_effort: str = ""
    # prefix cache entries are shared only among requests with the same salt (the API sets one per API key
    # when it accepts several), so one tenant's cached_tokens say nothing of another's prompts
    cache_salt: str = ""


class Started(Msg):
    """The request was admitted; prompt_tokens counts its prompt after templating."""

    request_id: str
    prompt_tokens: int


class TopLogprob(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """One candidate token at a position: its text, log probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """The sampled token at one position, with the most likely alternatives when asked (logprob None: a prompt's
    first token, which nothing predicts)."""

    token: str
    logprob: float | None
    bytes: list[int]
    top: list[TopLogprob] = []


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    """One tool call parsed from the model's output; arguments is a JSON object as text (unless partial)."""

    id: str
    name: str
    arguments: str
    # cut by max_tokens before its end: arguments is the text written so far, often not valid JSON yet
    partial: bool = False


class Delta(Msg):
    """Newly decoded output of a running request, split into content, reasoning and tool calls."""

    request_id: str
    text: str
    completion_tokens: int
    # non-default fields only when the request asked for them or the model produced them
    index: int = 0
    reasoning: str = ""
    tool_calls: list[ToolCall] = []
    logprobs: list[TokenLogprob] = []
    # prompt tokens whose KV came from the prefix cache: known once the choice joins the batch, when the engine
    # sends its first Delta (empty but for an echoed prompt), so a stream's first event can report them
    cached_tokens: int = 0


class Finish(Msg):
    """One choice ended normally (all n of them: nothing follows on this connection)."""

    request_id: str
    finish_reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int
    # prompt tokens whose KV came from the prefix cache instead of being computed
    cached_tokens: int = 0
    text: str = ""
    index: int = 0
    reasoning: str = ""
    tool_calls: list[ToolCall] = []
    logprobs: list[TokenLogprob] = []
    # the stop string that ended the choice (finish_reason "stop"); None for EOS, a tool call or length
    stop_sequence: str | None = None


class Tokenize(Msg):
    """The tokens of a prompt, or of a chat rendered exactly as a Generate's would be; answered with Tokenized.

    Rank 0 answers it on its own: nothing reaches the plan or the other ranks.
    """

    kind: Literal["chat", "completion"]
    # completion: the text as given
    prompt: str = ""
    # chat: as in Generate (every tool is rendered: no tool_choice hides them)
    messages: list[dict[str, Any]] = []
    tools: list[dict[str, Any]] | None = None
    enable_thinking: bool | None = None
    reasoning_effort: str = ""
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    # None: as a Generate of this kind (a completion adds the tokenizer's special tokens, a chat does not)
    add_special_tokens: bool | None = None
    return_token_strs: bool = False


class Tokenized(Msg):
    """The token ids of a Tokenize, the model's context length, and each token's string when asked."""

    tokens: list[int]
    max_model_len: int
    token_strs: list[str] | None = None


class Detokenize(Msg):
    """The text of token ids (rank 0 alone answers it, with Detokenized)."""

    tokens: list[int]


class Detokenized(Msg):
    """The text a Detokenize's ids decode to."""

    prompt: str


class Embed(Msg):
    """Embed each input with the embedding helper; answered with Embedded (rank 0 alone: never in a plan).

    An input longer than the helper's max_tokens is cut to it with truncate, else refused naming param[i]."""

    request_id: str
    inputs: list[str | list[int]]
    truncate: bool = False
    # fewer dimensions than the helper's (a matryoshka model's embedding cut, then renormalized); 0: all of them
    dimensions: int = 0
    param: str = "input"  # the request's name of the inputs, for errors: "input[2]"


class Embedded(Msg):
    """Embeddings of inputs index, index + 1, ...: float32 little-endian bytes each (the width Embed asked for).

    A large answer comes in several frames, each within the socket's frame limit; more: another one follows."""

    request_id: str
    embeddings: list[bytes]
    prompt_tokens: int
    dimensions: int
    index: int = 0
    more: bool = False


class Rerank(Msg):
    """Score each document's relevance to the query with the rerank helper; answered with Reranked."""

    request_id: str
    query: str
    documents: list[str]
    truncate: bool = False  # cut the document of a pair longer than the helper's max_tokens, else refuse it
    param: str = "documents"


class Reranked(Msg):
    """Each document's relevance in [0, 1], in the order sent (the gateway sorts)."""

    request_id: str
    scores: list[float]
    prompt_tokens: int


class HelperHello(Msg):
    """Rank 0's first frame to the helper rank's listener (HELPER_RANK): the protocol version and the token the
    ranks agreed at startup; a connection without the right token is dropped."""

    version: int
    token: int


class HelperWelcome(Msg):
    """The helper rank's answer to HelperHello: the helpers it serves. Then one Embed or Rerank per connection."""

    version: int
    helpers: list[HelperState] = []


class Error(Msg):
    """A failure; the API rebuilds its own error class from status and code (each dialect names the type)."""

    status: int
    message: str
    code: str | None = None
    param: str | None = None
    request_id: str = ""


Message = Union[Hello, Welcome, InfoRequest, Info, Generate, Started, Delta, Finish, Tokenize, Tokenized, Detokenize,
                Detokenized, Embed, Embedded, Rerank, Reranked, HelperHello, HelperWelcome, Error]
