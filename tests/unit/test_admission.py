"""Rank 0's trust boundary without MLX: validate.check's rules, and room for a request's choices."""

from __future__ import annotations

import math

import pytest

from engine.rank0 import validate
from engine.rank0.errors import Refused
from engine.rank0.requests import Counters
from ipc import Detokenize, Generate, SamplingParams, Tokenize

LIMITS = validate.Limits(vocab_size=1000, logits_size=1024, context_length=4096, max_batch=4, max_queue=4)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def gen(kind: str = "chat", request_id: str = "chatcmpl-1", **kw) -> Generate:
    fields = {k: kw.pop(k) for k in ("messages", "tools", "tool_choice") if k in kw}
    fields.setdefault("messages", [{"role": "user", "content": "hi"}])
    return Generate(request_id=request_id, kind=kind, params=SamplingParams(**{"max_tokens": 8, **kw}), **fields)


REFUSED = {
    "request id with a slash": (dict(request_id="a/1"), "request_id"),
    "empty request id": (dict(request_id=""), "request_id"),
    "max_tokens 0": (dict(max_tokens=0), "max_tokens"),
    "n 0": (dict(n=0), "n"),
    "n beyond the maximum": (dict(n=validate.MAX_CHOICES + 1), "n"),
    "n beyond the engine's capacity": (dict(n=9), "n"),
    "negative temperature": (dict(temperature=-0.1), "temperature"),
    "infinite temperature": (dict(temperature=math.inf), "temperature"),
    "nan temperature": (dict(temperature=math.nan), "temperature"),
    "temperature whose inverse underflows": (dict(temperature=1e300), "temperature"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p above 1": (dict(top_p=1.5), "top_p"),
    "min_p above 1": (dict(min_p=1.5), "min_p"),
    "negative top_k": (dict(top_k=-1), "top_k"),
    "repetition_penalty 0": (dict(repetition_penalty=0.0), "repetition_penalty"),
    "presence_penalty too large": (dict(presence_penalty=2.5), "presence_penalty"),
    "frequency_penalty nan": (dict(frequency_penalty=math.nan), "frequency_penalty"),
    "logit_bias outside the vocabulary": (dict(logit_bias={1000: 1.0}), "logit_bias"),
    "logit_bias too large": (dict(logit_bias={5: 101.0}), "logit_bias"),
    "too many top_logprobs": (dict(top_logprobs=validate.MAX_TOP_LOGPROBS + 1), "top_logprobs"),
    "too many stop strings": (dict(stop=["x"] * (validate.MAX_STOP_STRINGS + 1)), "stop"),
    "an empty stop string": (dict(stop=[""]), "stop"),
    "a stop string too long": (dict(stop=["x" * (validate.MAX_STOP_CHARS + 1)]), "stop"),
    "a message without a role": (dict(messages=[{"content": "hi"}]), "messages[0].role"),
    "too many tools": (dict(tools=[TOOL] * (validate.MAX_TOOLS + 1)), "tools"),
    "a tool that is not a function": (dict(tools=[{"type": "retrieval"}]), "tools[0]"),
    "a tool whose parameters are not an object":
        (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": []}}]),
         "tools[0].function.parameters"),
    "tool_choice required without tools": (dict(tool_choice="required"), "tool_choice"),
    "tool_choice naming an unknown tool":
        (dict(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "other"}}), "tool_choice"),
    "tool_choice of an unknown kind": (dict(tools=[TOOL], tool_choice="sometimes"), "tool_choice"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_a_value_the_engine_cannot_run_is_refused_naming_its_param(case: str) -> None:
    kw, param = REFUSED[case]
    with pytest.raises(Refused) as info:
        validate.check(gen(**kw), LIMITS)
    error = info.value.error
    assert (error.status, error.param) == (400, param)
    assert error.message == str(info.value)


def test_a_refusal_becomes_the_error_frame_of_its_request() -> None:
    with pytest.raises(Refused) as info:
        validate.check(gen(max_tokens=0), LIMITS)
    frame = info.value.to("chatcmpl-9")
    assert frame.request_id == "chatcmpl-9" and frame.param == "max_tokens" and frame.status == 400


def test_a_valid_request_passes_unchanged() -> None:
    g = gen(tools=[TOOL], tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=0.7,
            top_p=0.9, top_k=40, min_p=0.05, logit_bias={5: -100.0}, stop=["\n"], n=8, top_logprobs=20,
            presence_penalty=-2.0, frequency_penalty=2.0, repetition_penalty=1.1)
    assert validate.check(g, LIMITS) is g
    completion = gen(kind="completion", messages=[{"no": "role"}])  # completions do not read messages
    assert validate.check(completion, LIMITS) is completion


def test_limits_beyond_the_model_are_clamped_not_refused() -> None:
    small = validate.Limits(vocab_size=10, logits_size=10, context_length=4096, max_batch=4, max_queue=4)
    g = validate.check(gen(top_k=5000, top_logprobs=20), small)
    assert (g.params.top_k, g.params.top_logprobs) == (0, 10)


@pytest.mark.parametrize("temperature", [1e-63, 5e-4])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature: float) -> None:
    assert validate.check(gen(temperature=temperature), LIMITS).params.temperature == 0.0
    assert validate.check(gen(temperature=0.5), LIMITS).params.temperature == 0.5


TOKENIZE_REFUSED = {
    "a message without a role": (Tokenize(kind="chat", messages=[{"content": "hi"}]), "messages[0].role"),
    "a tool that is not a function": (Tokenize(kind="chat", messages=[{"role": "user"}], tools=[{"type": "x"}]),
                                      "tools[0]"),
    "too many tools": (Tokenize(kind="chat", messages=[{"role": "user"}], tools=[TOOL] * (validate.MAX_TOOLS + 1)),
                       "tools"),
    "a tool schema that is not JSON": (Tokenize(kind="chat", messages=[{"role": "user"}], tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"x": b"\x00"}}}]), "tools"),
    "continuing the last message after a generation prompt":
        (Tokenize(kind="chat", messages=[{"role": "user"}], continue_final_message=True), "continue_final_message"),
    "an id below the vocabulary": (Detokenize(tokens=[3, -1]), "tokens[1]"),
    "an id beyond the vocabulary": (Detokenize(tokens=[999, 1000, 5]), "tokens[1]"),
    "more ids than a context holds": (Detokenize(tokens=[1] * (LIMITS.context_length + 1)), "tokens"),
}


@pytest.mark.parametrize("case", sorted(TOKENIZE_REFUSED))
def test_a_tokenize_or_detokenize_the_engine_cannot_run_is_refused_naming_its_param(case: str) -> None:
    msg, param = TOKENIZE_REFUSED[case]
    with pytest.raises(Refused) as info:
        if isinstance(msg, Tokenize):
            validate.check_tokenize(msg, LIMITS)
        else:
            validate.check_detokenize(msg, LIMITS)
    assert (info.value.error.status, info.value.error.param) == (400, param)


def test_valid_tokenize_and_detokenize_pass() -> None:
    validate.check_tokenize(Tokenize(kind="chat", messages=[{"role": "user", "content": "hi"}], tools=[TOOL],
                                     add_generation_prompt=False, continue_final_message=True), LIMITS)
    validate.check_tokenize(Tokenize(kind="completion", prompt="", messages=[{"no": "role"}]), LIMITS)
    validate.check_detokenize(Detokenize(tokens=[0, 999] * (LIMITS.context_length // 2)), LIMITS)
    validate.check_detokenize(Detokenize(tokens=[]), LIMITS)


def test_counters_admit_choices_only_while_running_plus_waiting_fits() -> None:
    counters = Counters()
    assert counters.admit(3, capacity=LIMITS.capacity)
    counters.active = 4
    assert not counters.admit(2, capacity=LIMITS.capacity)  # 4 running + 3 waiting + 2 > 8
    assert counters.waiting == 3  # a refusal reserves nothing
    assert counters.admit(1, capacity=LIMITS.capacity)
    assert (counters.waiting, counters.active) == (4, 4)
