"""Hypothesis strategies for hostile input: socket messages and HTTP bodies from the whole space their
schemas admit, weighted towards the boundaries (NaN, infinities, 64-bit extremes, the vocabulary's edge).

Shared by tests/integration/test_hostile_engine.py and bench/hostile.py (the longer run).
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st

from engine.modelgen.tokenizer import ADDED_TOKENS, SPECIAL_TOKENS
from ipc import Detokenize, Embed, Generate, Rerank, SamplingParams, Tokenize
from tests.images import PNG, data_url

VOCAB = 1024  # the demo model's vocabulary: top_k and token ids around it are the interesting ones

I64 = (-(2**63), 2**63 - 1)
U64_MAX = 2**64 - 1

floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1.0, 2.0, -2.0, 0.5, 1e-300, 1e300, 100.0, -100.0, 101.0])
ints = (st.integers(-3, 40) | st.integers(min_value=I64[0], max_value=U64_MAX)
        | st.sampled_from([VOCAB - 1, VOCAB, VOCAB + 1, 2**31, 2**32, 2**63 - 1, U64_MAX, -(2**63)]))
small_text = st.text(max_size=12)
json_scalars = st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | small_text
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(small_text, inner, max_size=3), max_leaves=8)


def mostly(good: st.SearchStrategy, bad: st.SearchStrategy, odds: int = 16) -> st.SearchStrategy:
    """good, with one chance in `odds` of bad: a request then has a few hostile values, not all at once,
    so examples reach past the first check into admission, the batch and the output path."""
    return st.integers(0, odds - 1).flatmap(lambda i: bad if i == 0 else good)


# Text a client types, with the text of the demo tokenizer's special and added tokens in it: it must stay text.
typed_text = st.lists(st.sampled_from(SPECIAL_TOKENS + ADDED_TOKENS) | st.text(max_size=8), max_size=6).map("".join)


def without_specials(value: Any) -> Any:
    """value with every special token's text taken out of its strings (keys too): the same chat, whose only
    special tokens are the ones its template writes."""
    if isinstance(value, str):
        for s in SPECIAL_TOKENS:
            value = value.replace(s, "")
        return value
    if isinstance(value, dict):
        return {without_specials(k): without_specials(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_specials(v) for v in value]
    return value


VALID_SCHEMAS = [
    {"type": "object"},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "object", "properties": {"p": {"$ref": "#/$defs/P"}}, "required": ["p"],
     "$defs": {"P": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}},
    {"type": "array", "items": {"type": "number"}, "maxItems": 2},
    {},
]
BROKEN_SCHEMAS = [{"$ref": "#/$defs/missing"}, {"type": "nonsense"}, {"type": "object", "required": 5}]


def _cycle(kind: str, needed: int, escape: bool, named: bool) -> dict[str, Any]:
    """A schema that refers to itself: an object with a property "next" of itself (required when needed),
    or an array of itself with minItems needed; escape adds a null way out. Some end, some never do."""
    ref = "#/$defs/node" if named else "#"
    if kind == "object":
        node: dict[str, Any] = {"type": "object", "properties": {"value": {"type": "integer"}, "next": {"$ref": ref}},
                                "required": ["next"] if needed else ["value"]}
    else:
        node = {"type": "array", "items": {"$ref": ref}, "minItems": needed}
    if escape:
        node = {"anyOf": [node, {"type": "null"}]}
    return {"$defs": {"node": node}, "$ref": ref} if named else node


cyclic_schemas = st.builds(_cycle, st.sampled_from(["object", "array"]), st.integers(0, 2), st.booleans(),
                           st.booleans())


def _held_to(schema: dict[str, Any], as_tool: bool, stream: bool, max_tokens: int) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                            "max_tokens": max_tokens, "stream": stream}
    if as_tool:
        body["tools"] = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
        body["tool_choice"] = {"type": "function", "function": {"name": "f"}}
    else:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    return body


# A plain chat whose output is held to a schema that refers to itself, as a response_format or a forced
# tool: whether its recursion can end decides between an answer and a 400, never a 500.
schema_bodies = st.builds(_held_to, cyclic_schemas, st.booleans(), st.booleans(), st.integers(1, 8))
schemas = mostly(st.sampled_from(VALID_SCHEMAS) | cyclic_schemas,
                 st.sampled_from(BROKEN_SCHEMAS) | st.dictionaries(small_text, json_values, max_size=3), odds=4)

names = mostly(st.sampled_from(["get_weather", "lookup", "f"]), st.sampled_from(["", "a" * 80]) | small_text)
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": names}, optional={"description": mostly(small_text, typed_text, odds=4),
                               "parameters": mostly(schemas, json_values),
                               "strict": st.booleans()})})
tools = st.none() | st.lists(mostly(tool, st.dictionaries(small_text, json_values, max_size=2)), min_size=1,
                             max_size=3)
tool_choices = mostly(st.none() | st.sampled_from(["auto", "none", "required"])
                      | st.fixed_dictionaries({"type": st.just("function"),
                                               "function": st.fixed_dictionaries({"name": names})}),
                      st.sampled_from(["sometimes", ""]) | st.dictionaries(small_text, json_values, max_size=2))

good_message = st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                      "content": mostly(st.text(max_size=40), typed_text, odds=3)})
roles = st.sampled_from(["system", "developer", "user", "assistant", "tool", "banana"]) | st.integers(0, 3)
# an OpenAI image part as a client sends it: a real file, an empty or damaged one, a URL the server may not fetch
image_urls = st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.fixed_dictionaries({
    "url": st.sampled_from([data_url(PNG), data_url(PNG[:40]), "data:,", "http://127.0.0.1:1/a.png"]) | small_text})})
contents = (small_text | typed_text | st.none() | st.integers()
            | st.lists(st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]), "text": small_text})
                       | image_urls, max_size=2))
bad_message = st.fixed_dictionaries({"role": roles, "content": contents}, optional={
    "tool_call_id": small_text, "name": small_text,
    "tool_calls": st.lists(st.fixed_dictionaries({"id": small_text, "type": st.just("function"), "function":
                           st.fixed_dictionaries({"name": names, "arguments": small_text | json_values})}),
                           max_size=2) | json_values,
    "reasoning_content": small_text | typed_text})
messages = st.lists(mostly(good_message, bad_message), min_size=1, max_size=4) | st.just([])
# the canonical image part on the socket, its fields anything their types admit (the API checks real ones)
image_parts = st.fixed_dictionaries({"type": st.just("image"), "sha256": small_text,
                                     "media_type": st.sampled_from(["image/png", "image/gif", ""]) | small_text,
                                     "width": ints, "height": ints, "data": st.binary(max_size=48)})
socket_messages = messages | st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "tool"]), "content":
                                      st.lists(image_parts | st.fixed_dictionaries({"type": st.just("text"),
                                                                                      "text": small_text}),
                                               min_size=1, max_size=3)}), min_size=1, max_size=2)


def _finite(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high)


sampling = st.builds(
    SamplingParams,
    max_tokens=mostly(st.integers(1, 8), ints),
    temperature=mostly(_finite(0, 2), floats),
    top_p=mostly(_finite(0.01, 1), floats),
    top_k=mostly(st.integers(0, VOCAB + 2), ints),
    min_p=mostly(_finite(0, 1), floats),
    seed=st.none() | ints,
    stop=mostly(st.lists(st.text(min_size=1, max_size=6), max_size=4), st.lists(st.text(max_size=6), max_size=20)),
    logit_bias=mostly(st.dictionaries(st.integers(0, VOCAB - 1), _finite(-100, 100), max_size=4),
                      st.dictionaries(ints, floats, max_size=4)),
    repetition_penalty=mostly(st.none() | _finite(0.01, 5), floats),
    presence_penalty=mostly(st.none() | _finite(-2, 2), floats),
    frequency_penalty=mostly(st.none() | _finite(-2, 2), floats),
    n=mostly(st.integers(1, 4), st.integers(-2, 20) | st.sampled_from([0, 128, 129, 10**6])),
    logprobs=st.booleans(),
    top_logprobs=mostly(st.integers(0, 20), st.integers(-2, 25) | ints),
)
request_ids = mostly(st.from_regex(r"[A-Za-z0-9_.:\-]{1,40}", fullmatch=True), st.text(max_size=140))

generates = st.builds(
    Generate,
    request_id=request_ids,
    kind=st.sampled_from(["chat", "completion"]),
    params=sampling,
    messages=socket_messages,
    tools=tools,
    prompt=mostly(st.text(min_size=1, max_size=40) | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
                  st.text(max_size=40) | st.lists(ints, max_size=8)),
    echo=st.booleans(),
    tool_choice=tool_choices,
    parallel_tool_calls=st.booleans(),
    json_schema=st.none() | schemas,
    enable_thinking=st.none() | st.booleans(),
)


def _optional(**fields: st.SearchStrategy) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries({}, optional=fields)


response_formats = mostly(
    st.sampled_from([{"type": "text"}, {"type": "json_object"}])
    | st.builds(lambda s, strict: {"type": "json_schema", "json_schema": {"name": "x", "schema": s, "strict": strict}},
                schemas, st.booleans()),
    st.dictionaries(small_text, json_values, max_size=2))

# Every field of the OpenAI chat request, each mostly plausible, sometimes at or past its boundary.
chat_bodies = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries({"model": mostly(st.sampled_from(["default", "demo-tiny"]), small_text),
                           "messages": messages}),
    _optional(
        max_tokens=mostly(st.integers(1, 8), st.none() | ints),
        max_completion_tokens=mostly(st.integers(1, 8), st.none() | ints),
        temperature=mostly(_finite(0, 2), floats),
        top_p=mostly(_finite(0.01, 1), floats),
        top_k=mostly(st.integers(-1, VOCAB + 2), ints),
        min_p=mostly(_finite(0, 1), floats),
        seed=st.none() | ints,
        n=mostly(st.integers(1, 3), st.integers(-2, 20) | st.sampled_from([128, 129])),
        stop=mostly(st.none() | st.text(min_size=1, max_size=5) | st.lists(st.text(min_size=1, max_size=5), max_size=4),
                    st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6)),
        logit_bias=mostly(st.dictionaries(st.integers(0, VOCAB - 1).map(str), _finite(-100, 100), max_size=3),
                          st.dictionaries(st.integers(-3, VOCAB + 3).map(str) | small_text, floats | json_values,
                                          max_size=3)),
        presence_penalty=mostly(_finite(-2, 2), floats),
        frequency_penalty=mostly(_finite(-2, 2), floats),
        repetition_penalty=mostly(_finite(0.01, 3), floats),
        logprobs=st.none() | st.booleans(),
        top_logprobs=mostly(st.integers(0, 20), st.integers(-2, 25)),
        tools=tools, tool_choice=tool_choices,
        parallel_tool_calls=st.none() | st.booleans(), user=small_text,
        response_format=response_formats,
        reasoning_effort=st.none() | st.sampled_from(["none", "low", "high"]),
        stream=st.booleans(), stream_options=st.none() | st.fixed_dictionaries({"include_usage": st.booleans()}),
        something_else=json_values,
    ),
)

# Chats whose every client string may hold special tokens' text: a tool call (name, JSON arguments), its result,
# tools whose description and schema keys hold it.
typed_messages = st.lists(
    st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                           "content": typed_text})
    | st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": st.just("call_1"), "content": typed_text})
    | st.builds(lambda name, args: {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
        typed_text, st.dictionaries(typed_text, typed_text, max_size=2)),
    min_size=1, max_size=4)
typed_tools = st.lists(st.builds(lambda text, key: {"type": "function", "function": {
    "name": "f", "description": text,
    "parameters": {"type": "object", "properties": {key: {"type": "string", "description": text}}}}},
    typed_text, typed_text), min_size=1, max_size=2)
typed_chats = st.fixed_dictionaries({"messages": typed_messages}, optional={"tools": typed_tools})

# Rank 0's Tokenize and Detokenize: the same chats and tools as a Generate's, and ids around the vocabulary's edge.
token_ids = mostly(st.lists(st.integers(0, VOCAB - 1), max_size=40),
                   st.lists(ints, max_size=8) | st.lists(st.integers(0, VOCAB - 1), min_size=5000, max_size=9000))
tokenizes = st.builds(
    Tokenize,
    kind=st.sampled_from(["chat", "completion"]),
    prompt=st.text(max_size=200),
    messages=socket_messages,
    tools=tools,
    enable_thinking=st.none() | st.booleans(),
    add_generation_prompt=st.booleans(),
    continue_final_message=mostly(st.just(False), st.just(True), odds=4),
    add_special_tokens=st.none() | st.booleans(),
    return_token_strs=st.booleans(),
)
detokenizes = st.builds(Detokenize, tokens=token_ids)

# vLLM's /tokenize bodies (a prompt, or a chat) and /detokenize bodies, each field sometimes hostile.
tokenize_bodies = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries({"prompt": mostly(st.text(max_size=200), json_values)})
    | st.fixed_dictionaries({"messages": messages}),
    _optional(
        model=mostly(st.sampled_from(["default", "demo-tiny"]), st.none() | small_text),
        add_special_tokens=mostly(st.booleans(), json_values),
        return_token_strs=mostly(st.booleans(), json_values),
        add_generation_prompt=mostly(st.booleans(), json_values),
        continue_final_message=mostly(st.booleans(), json_values),
        chat_template_kwargs=mostly(st.none() | st.fixed_dictionaries({}, optional={"enable_thinking": st.booleans()}),
                                    st.dictionaries(small_text, json_values, max_size=2) | json_values),
        chat_template=mostly(st.none(), small_text),
        tools=tools,
        something_else=json_values,
    ),
)
detokenize_bodies = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries({"tokens": mostly(token_ids, json_values | st.lists(floats, max_size=3))}),
    _optional(model=mostly(st.sampled_from(["default", "demo-tiny"]), st.none() | small_text),
              something_else=json_values),
)

# Embed and Rerank for the helper models (the zoo embedder: 512 tokens, 64 dimensions): texts and ids around the
# vocabulary's edge, inputs past the helper's context, counts and dimensions at and past their limits.
helper_inputs = mostly(st.lists(mostly(typed_text.map(lambda t: t or "x")
                                       | st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=8),
                                       st.just("") | st.lists(ints, max_size=4) | st.just("word " * 600)
                                       | st.lists(st.integers(0, VOCAB - 1), min_size=513, max_size=600), odds=8),
                                min_size=1, max_size=5), st.just([]) | st.lists(st.just("a"), min_size=6, max_size=7))
embeds = st.builds(Embed, request_id=request_ids, inputs=helper_inputs, truncate=st.booleans(),
                   dimensions=mostly(st.sampled_from([0, 1, 16, 64]), ints), param=st.sampled_from(["input", "prompt"]))
reranks = st.builds(Rerank, request_id=request_ids, query=mostly(st.text(max_size=30), st.just("")),
                    documents=st.lists(st.text(max_size=30), max_size=5))
