"""No request can take the engine down: rank 0 refuses what the model cannot run, and a failure inside
a batched step ends only the requests it belongs to."""

from __future__ import annotations

import concurrent.futures as cf
import json
import math
import os
import subprocess
import sys

import httpx
import pytest

from ipc import Delta, Error, Finish, Generate, SamplingParams, Started
from tests import wire
from tests.harness import REPO, Stack, wait_for

CHAT = [{"role": "user", "content": "hello there"}]


def gen(rid: str = "chatcmpl-boundary", n: int = 1, **params) -> Generate:
    params.setdefault("max_tokens", 4)
    params.setdefault("temperature", 0.0)
    return Generate(request_id=rid, kind="chat", messages=CHAT, params=SamplingParams(n=n, **params))


def served_normally(path) -> None:
    """The engine answers a plain request to the end, and nothing is left running or queued."""
    frames = wire.run(path, gen("chatcmpl-afterwards"))
    assert isinstance(frames[0], Started) and isinstance(frames[-1], Finish), frames
    wait_for(lambda: (lambda i: i.active == 0 and i.queued == 0)(wire.info(path)), 10, "an idle engine")


def post(stack, body: dict, path: str = "/v1/chat/completions") -> httpx.Response:
    with httpx.Client(timeout=60) as http:
        return http.post(stack.base_url + path, json=body)


# Values the schema of the socket admits but the model cannot run: each is refused, by name.
REFUSED = {
    "max_tokens 0": (dict(max_tokens=0), "max_tokens"),
    "max_tokens negative": (dict(max_tokens=-3), "max_tokens"),
    "repetition_penalty 0": (dict(repetition_penalty=0.0), "repetition_penalty"),
    "repetition_penalty negative": (dict(repetition_penalty=-1.0), "repetition_penalty"),
    "min_p above 1": (dict(min_p=1.5), "min_p"),
    "min_p NaN": (dict(min_p=math.nan), "min_p"),
    "temperature NaN": (dict(temperature=math.nan), "temperature"),
    "temperature infinite": (dict(temperature=math.inf), "temperature"),
    "temperature negative": (dict(temperature=-1.0), "temperature"),
    "top_p 0": (dict(top_p=0.0), "top_p"),
    "top_p above 1": (dict(top_p=1.01), "top_p"),
    "top_k negative": (dict(top_k=-5), "top_k"),
    "presence_penalty infinite": (dict(presence_penalty=-math.inf), "presence_penalty"),
    "frequency_penalty huge": (dict(frequency_penalty=1e30), "frequency_penalty"),
    "logit_bias NaN": (dict(logit_bias={1: math.nan}), "logit_bias"),
    "logit_bias beyond the vocabulary": (dict(logit_bias={10**12: 1.0}), "logit_bias"),
    "top_logprobs 21": (dict(logprobs=True, top_logprobs=21), "top_logprobs"),
    "empty stop string": (dict(stop=[""]), "stop"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_values_the_model_cannot_run_are_refused_by_name_and_the_engine_keeps_serving(stack, case):
    params, param = REFUSED[case]
    frames = wire.run(stack.socket, gen(**params))
    assert len(frames) == 1 and isinstance(frames[0], Error), frames
    err = frames[0]
    assert (err.status, err.param) == (400, param), err
    assert err.request_id == "chatcmpl-boundary"
    served_normally(stack.socket)


@pytest.mark.parametrize("n", [0, -1, 129])
def test_a_choice_count_outside_1_to_128_is_refused_instead_of_hanging(stack, n):
    frames = wire.run(stack.socket, gen(n=n), timeout=10)
    assert len(frames) == 1 and isinstance(frames[0], Error) and frames[0].param == "n", frames


def test_a_request_id_that_could_collide_with_another_requests_choice_is_refused(stack):
    # Choice 1 of request "c" runs as "c/1": a request named "c/1" beside it once ended every rank.
    with wire.Session(stack.socket) as first:
        first.send(gen("c", n=2, max_tokens=64, temperature=1.0))
        assert isinstance(first.recv(), Started)
        frames = wire.run(stack.socket, gen("c/1"))
        assert isinstance(frames[0], Error) and frames[0].param == "request_id", frames
        assert "'/'" in frames[0].message
    served_normally(stack.socket)


@pytest.mark.parametrize("tools, choice, param", [
    ([{"type": "function"}], None, "tools[0]"),
    ([{"type": "function", "function": {"name": "f", "parameters": "nope"}}], None, "tools[0].function.parameters"),
    ([{"type": "function", "function": {"name": "f"}}], {"type": "function", "function": {"name": "g"}}, "tool_choice"),
    ([{"type": "function", "function": {"name": "f"}}], "sometimes", "tool_choice"),
    (None, "required", "tool_choice"),
])
def test_malformed_tools_over_the_socket_are_refused_by_name(stack, tools, choice, param):
    msg = Generate(request_id="chatcmpl-tools", kind="chat", messages=CHAT, tools=tools, tool_choice=choice,
                   params=SamplingParams(max_tokens=4))
    frames = wire.run(stack.socket, msg)
    assert len(frames) == 1 and isinstance(frames[0], Error), frames
    assert (frames[0].status, frames[0].param) == (400, param), frames[0]
    served_normally(stack.socket)


@pytest.mark.parametrize("top_k", [1024, 4096, 10**9])
def test_top_k_at_or_beyond_the_vocabulary_keeps_every_token_instead_of_killing_the_engine(stack, top_k):
    body = {"model": "default", "messages": CHAT, "max_tokens": 8, "seed": 3, "top_k": top_k}
    unfiltered = post(stack, {**body, "top_k": 0})
    r = post(stack, body)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"] == unfiltered.json()["choices"][0]["message"]["content"]
    assert post(stack, {"model": "default", "messages": CHAT, "max_tokens": 2}).status_code == 200


# ---- failures inside the batched step (fault injection through ENGINE_FAILPOINT) -----------------

FAIL_SEED = 4242


def stream_text(base_url: str, body: dict) -> tuple[int, str, list[dict]]:
    """(status, content, error events) of a streamed chat completion."""
    import json

    text, errors = [], []
    with httpx.Client(timeout=60) as http, http.stream("POST", base_url + "/v1/chat/completions",
                                                        json={**body, "stream": True}) as r:
        if r.status_code != 200:
            r.read()
            return r.status_code, "", [r.json()]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                errors.append(chunk["error"])
            else:
                text += [c["delta"].get("content") or "" for c in chunk["choices"]]
    return r.status_code, "".join(text), errors


@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=pytest.mark.multirank)])
@pytest.mark.parametrize("mode", ["sampler", "step"])
def test_a_request_that_fails_inside_the_step_ends_alone_with_an_error_and_the_engine_serves_on(mode, ranks):
    s = Stack(extra={"ENGINE_FAILPOINT": f"{mode}:{FAIL_SEED}", "MCS_TEST_HOOKS": "1"})
    engine, api = s.start_engine(ranks=ranks), s.start_api()
    try:
        innocent = {"model": "default", "messages": [{"role": "user", "content": "a long answer please"}],
                    "max_tokens": 48, "temperature": 0}
        solo = stream_text(s.base_url, innocent)
        assert solo[0] == 200 and not solo[2]
        bad = {"model": "default", "messages": CHAT, "max_tokens": 48, "temperature": 1, "seed": FAIL_SEED}
        with cf.ThreadPoolExecutor(2) as pool:
            beside = pool.submit(stream_text, s.base_url, innocent) if mode == "sampler" else None
            failed = stream_text(s.base_url, bad)
            beside_result = beside.result(timeout=60) if beside else None
        status, _, errors = failed
        assert status == 200 and len(errors) == 1, failed
        assert errors[0]["code"] == "generation_failed" and "engine keeps serving" in errors[0]["message"]
        if beside_result is not None:
            # A sampler failing for one request leaves the others of the same steps untouched.
            assert beside_result == solo
        # Not streamed: the same failure is a 500 with the error object, and then plain service resumes.
        r = post(s, {**bad, "stream": False})
        assert r.status_code == 500 and r.json()["error"]["code"] == "generation_failed", r.text
        assert stream_text(s.base_url, innocent) == solo
        served_normally(s.socket)  # on two ranks, rank 0 cannot step without rank 1: both survived
        assert wire.info(s.socket).ranks == ranks
        assert httpx.get(s.base_url + "/health", timeout=10).json()["test_hooks"] is True  # never unnoticed
    finally:
        api.stop()
        engine.stop()


def test_a_stray_failpoint_without_the_test_switch_fails_nothing():
    """What the sampler compares each token with and the batch each step with, as a rank reads them at its start."""
    probe = ("import os; from engine.decoding.sampling import _FAIL_SEED, failpoint_seed; "
             f"os.environ['ENGINE_FAILPOINT'] = 'step:{FAIL_SEED}'; print(_FAIL_SEED, failpoint_seed('step'))")
    env = {k: v for k, v in os.environ.items() if k != "MCS_TEST_HOOKS"}
    r = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120,
                       env={**env, "ENGINE_FAILPOINT": f"sampler:{FAIL_SEED}"})
    assert r.returncode == 0 and r.stdout.split() == ["None", "None"], r.stdout + r.stderr


# ---- admission: capacity counts sequences, bursts into an idle engine fit ------------------------

def test_a_burst_of_max_batch_plus_max_queue_requests_into_an_idle_engine_is_all_admitted():
    s = Stack(extra={"MAX_BATCH": "2", "MAX_QUEUE": "2"})
    engine, api = s.start_engine(), s.start_api()
    try:
        body = {"model": "default", "messages": CHAT, "max_tokens": 24}
        for _ in range(5):
            with cf.ThreadPoolExecutor(4) as pool:
                statuses = sorted(r.status_code for r in pool.map(lambda _: post(s, body), range(4)))
            assert statuses == [200] * 4
        # n counts: five choices can never fit in 2 + 2 sequences (400); four fit only into an idle engine.
        r = post(s, {**body, "n": 5})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
        with wire.Session(s.socket) as busy:
            busy.send(gen("chatcmpl-busy", max_tokens=3000))
            assert isinstance(busy.recv(), Started)
            r = post(s, {**body, "n": 4})
            assert r.status_code == 429 and r.headers.get("retry-after"), r.text
        wait_for(lambda: wire.info(s.socket).active == 0, 10, "the cancelled request to leave the batch")
        assert post(s, {**body, "n": 4}).status_code == 200
    finally:
        api.stop()
        engine.stop()


# ---- a client that stops reading -------------------------------------------------------------------

def test_a_client_that_stops_reading_is_cancelled_instead_of_growing_rank_0s_memory():
    s = Stack(extra={"OUTPUT_BUFFER_EVENTS": "16"})
    engine = s.start_engine()
    try:
        # A tiny receive buffer fills after a few hundred frames; then the engine's outbox fills.
        stalled = wire.Session(s.socket, rcvbuf=4096)
        stalled.send(gen("chatcmpl-stalled", max_tokens=3500, logit_bias={0: -100.0, 1: -100.0, 2: -100.0}))
        assert isinstance(stalled.recv(), Started)
        # Others are served meanwhile, whole.
        no_eos = {t: -100.0 for t in range(3)}
        frames = wire.run(s.socket, gen("chatcmpl-beside", max_tokens=32, logit_bias=no_eos))
        assert isinstance(frames[-1], Finish) and frames[-1].completion_tokens == 32, frames
        wait_for(lambda: (lambda i: i.active + i.queued == 0)(wire.info(s.socket)), 30,
                 "rank 0 to cancel the stalled request")
        # Reading now: what the engine had sent, then the connection closed, without the 3500 tokens.
        frames = []
        while (frame := stalled.recv()) is not None:
            frames.append(frame)
        stalled.close()
        deltas = [f for f in frames if isinstance(f, Delta)]
        assert not any(isinstance(f, Finish) for f in frames)
        assert deltas and deltas[-1].completion_tokens < 3500
        served_normally(s.socket)
    finally:
        engine.stop()


# ---- found by red-teaming: grammars, reused ids, values JSON cannot hold -----------------------------

def wide_schema(properties: int) -> dict:
    return {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(properties)}}


def test_a_schema_too_costly_to_compile_on_every_rank_is_refused_and_the_engine_serves_on(stack):
    def held_to(schema: dict) -> dict:
        return {"model": "default", "messages": CHAT, "max_tokens": 2,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}

    # Refused by its size in grammar symbols, not by how long this machine took to compile it.
    r = post(stack, held_to(wide_schema(5000)))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text
    assert "too complex" in r.json()["error"]["message"] and "simplify" in r.json()["error"]["message"]
    served_normally(stack.socket)
    # Under that size a wide schema is served, its first key included (a key llguidance's mask allowed
    # and its parser then refused, when a committed row had a smaller bound than a mask step).
    r = post(stack, held_to(wide_schema(3000)))
    assert r.status_code == 200, r.text
    served_normally(stack.socket)


def test_many_choices_of_one_costly_schema_compile_it_once_instead_of_stalling_every_rank():
    # Compiling this schema takes most of a second; thirty-two compiles inside one step outlasted the
    # watchdog and ended the engine.
    s = Stack(extra={"WATCHDOG_TIMEOUT": "6"})
    engine, api = s.start_engine(), s.start_api()
    try:
        schema = {"type": "object", "properties": {"a": {"enum": [f"value number {i}" for i in range(50_000)]}},
                  "required": ["a"]}
        body = {"model": "default", "messages": CHAT, "max_tokens": 2, "n": 32,
                "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
        r = post(s, body)
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"]) == 32
        served_normally(s.socket)
        assert engine.alive()
    finally:
        api.stop()
        engine.stop()


def test_reusing_a_request_id_the_engine_is_still_ending_never_orphans_a_sequence(stack):
    long = dict(max_tokens=3000, logit_bias={0: -100.0, 1: -100.0, 2: -100.0})
    for attempt in range(8):
        rid = f"chatcmpl-reused-{attempt}"
        with wire.Session(stack.socket) as first:
            first.send(gen(rid, **long))
            assert isinstance(first.recv(), Started)
            first.recv()
        # At once, under the same id: refused while the old sequence is being let go, else served whole.
        frames = wire.run(stack.socket, gen(rid, max_tokens=6))
        if isinstance(frames[-1], Error):
            assert frames[-1].code == "request_id_in_use" and frames[-1].param == "request_id", frames[-1]
        else:
            assert isinstance(frames[-1], Finish) and frames[-1].completion_tokens == 6, frames
        served_normally(stack.socket)


@pytest.mark.parametrize("where", ["tools", "response_format"])
def test_bytes_in_a_schema_over_the_socket_are_refused_by_name(stack, where):
    schema = {"type": "object", "x": b"\x00"}
    if where == "tools":
        msg = Generate(request_id="chatcmpl-bytes", kind="chat", messages=CHAT, tool_choice="required",
                       tools=[{"type": "function", "function": {"name": "f", "parameters": schema}}],
                       params=SamplingParams(max_tokens=4))
    else:
        msg = Generate(request_id="chatcmpl-bytes", kind="chat", messages=CHAT, json_schema=schema,
                       params=SamplingParams(max_tokens=4))
    frames = wire.run(stack.socket, msg)
    assert isinstance(frames[0], Error) and (frames[0].status, frames[0].param) == (400, where), frames


@pytest.mark.parametrize("field", ["const", "tool name"])
def test_special_token_text_in_constrained_output_is_refused_instead_of_ending_mid_json(stack, field):
    body = {"model": "default", "messages": CHAT, "max_tokens": 16, "seed": 0}
    if field == "const":
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
            "type": "object", "properties": {"a": {"const": "x<|endoftext|>y"}}, "required": ["a"]}}}
    else:
        body["tools"] = [{"type": "function", "function": {"name": "<|im_end|>", "parameters": {"type": "object"}}}]
        body["tool_choice"] = "required"
    r = post(stack, body)
    assert r.status_code == 400, r.text
    assert "special token" in r.json()["error"]["message"]


def test_constrained_output_that_cannot_continue_ends_with_an_error_not_broken_json(stack):
    # Every value of this schema is infinite: the grammar gives up mid-output.
    endless = {"$defs": {"N": {"type": "object", "properties": {"c": {"$ref": "#/$defs/N"}}, "required": ["c"]}},
               "$ref": "#/$defs/N"}
    r = post(stack, {"model": "default", "messages": CHAT, "max_tokens": 64, "temperature": 0,
                     "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": endless}}})
    if r.status_code == 200:
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] == "length" or json.loads(choice["message"]["content"]) is not None, r.text
    else:
        assert r.json()["error"]["code"] in ("generation_failed", None), r.text
    served_normally(stack.socket)


def post_raw(stack, body: str) -> httpx.Response:
    with httpx.Client(timeout=60) as http:
        return http.post(stack.base_url + "/v1/chat/completions", content=body,
                         headers={"Content-Type": "application/json"})


@pytest.mark.parametrize("depth", [70, 959, 960, 961, 5000])
def test_deeply_nested_free_form_json_is_a_400_naming_where(stack, depth):
    deep = "[" * depth + "1" + "]" * depth  # written by hand: json.dumps itself recurses per level
    chat = json.dumps(CHAT)
    tool = ('{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "x": %s}}}' % deep)
    r = post_raw(stack, '{"model": "default", "max_tokens": 2, "messages": %s, "tools": [%s]}' % (chat, tool))
    assert r.status_code == 400, r.text
    turns = json.dumps([*CHAT, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "ARGS"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "3"}]).replace('"ARGS"', json.dumps(deep))
    r = post_raw(stack, '{"model": "default", "max_tokens": 2, "messages": %s}' % turns)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text


def test_a_repetition_penalty_that_would_overflow_the_logits_is_refused(stack):
    r = post(stack, {"model": "default", "messages": CHAT, "max_tokens": 2, "temperature": 0,
                     "repetition_penalty": 1e-45, "logprobs": True, "top_logprobs": 3})
    assert r.status_code == 400 and r.json()["error"]["param"] == "repetition_penalty", r.text


def test_a_vanishing_temperature_under_a_grammar_samples_greedily_instead_of_escaping_the_mask(stack):
    # Dividing by 1e-63 sent every log probability to -inf, and the sampler picked a token the grammar
    # forbids. Found by the hostile-input property test.
    msg = Generate(request_id="chatcmpl-cold", kind="completion", prompt="0", json_schema={"type": "object"},
                   params=SamplingParams(max_tokens=8, temperature=1.31516429141168e-63))
    frames = wire.run(stack.socket, msg)
    assert isinstance(frames[0], Started) and isinstance(frames[-1], Finish), frames
    assert not any(isinstance(f, Error) for f in frames)


# ---- found by the second red-team round: stop strings against constrained output ----------------------

ARG_TOOL = {"type": "function", "function": {"name": "get", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}


SMALL = {"type": "object", "properties": {"x": {"enum": [1, 2, 3]}}, "required": ["x"], "additionalProperties": False}
SMALL_TOOL = {"type": "function", "function": {"name": "get", "parameters": SMALL}}


@pytest.mark.parametrize("constraint", [
    {"tools": [SMALL_TOOL], "tool_choice": "required"},
    {"tools": [SMALL_TOOL], "tool_choice": {"type": "function", "function": {"name": "get"}}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "small", "schema": SMALL}}},
])
def test_a_stop_string_with_constrained_output_applies_to_free_text_only_and_never_cuts_its_json(stack, constraint):
    r = post(stack, {"model": "default", "messages": CHAT, "max_tokens": 60, "temperature": 0, "stop": ["}"],
                     **constraint})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if "tools" in constraint:
        assert choice["finish_reason"] == "tool_calls"
        args = [json.loads(c["function"]["arguments"]) for c in choice["message"]["tool_calls"]]
        assert args and all(a["x"] in (1, 2, 3) for a in args)
    else:
        assert choice["finish_reason"] == "stop" and json.loads(choice["message"]["content"])["x"] in (1, 2, 3)


def test_a_stop_string_inside_an_unforced_tool_call_cuts_it_without_leaking_markup(demo_tiny):
    # tool_choice auto: no grammar, so a stop string applies inside a call too. It cuts the call as
    # max_tokens would: a call that does not parse is dropped, and its markup never becomes content.
    from mlx_lm.tokenizer_utils import load

    from engine.rank0.output import OutputRules, TextSplitter

    rules = OutputRules(load(demo_tiny))
    splitter = TextSplitter(rules, rules.machine(chat=True, tools=True, stop=["}"]), "normal", [ARG_TOOL], True)
    piece, ended = splitter.feed('<tool_call>\n{"name": "get", "arguments": {"x": 1}')
    assert ended and (piece.content, piece.tool_calls) == ("", [])


def test_a_schema_holding_nan_over_the_socket_is_refused(stack):
    msg = Generate(request_id="chatcmpl-nan", kind="chat", messages=CHAT, json_schema={"const": math.nan},
                   params=SamplingParams(max_tokens=4))
    frames = wire.run(stack.socket, msg)
    assert isinstance(frames[0], Error) and frames[0].param == "response_format", frames
