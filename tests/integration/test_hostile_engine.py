"""Hostile input against the real engine and API: whatever the socket's or the HTTP schema admits either
runs or is refused with a 4xx, and after every example the engine still serves a plain request with
nothing left running or queued.

HOSTILE_EXAMPLES sets how many examples each property draws (CI: a few dozen, derandomized so CI is
stable), HOSTILE_RANKS the engine's ranks (1); `python -m bench.hostile` runs thousands with fresh
randomness.
"""

from __future__ import annotations

import json
import os

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from ipc import Detokenized, Embed, Embedded, Error, Finish, Generate, SamplingParams, Started, Tokenize, Tokenized
from tests import hostile, wire
from tests.harness import Stack, wait_for

EXAMPLES = int(os.environ.get("HOSTILE_EXAMPLES", "40"))
RANDOM = os.environ.get("HOSTILE_RANDOM") == "1"
RANKS = int(os.environ.get("HOSTILE_RANKS", "1"))
PLAIN = Generate(request_id="chatcmpl-plain", kind="chat", messages=[{"role": "user", "content": "hi"}],
                      params=SamplingParams(max_tokens=3, temperature=0.0))

hostile_settings = settings(max_examples=EXAMPLES, deadline=None, derandomize=not RANDOM, database=None,
                            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                   HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def small_stack():
    """Small limits, so that every admitted example is short and the capacity checks are in reach."""
    s = Stack(extra={"MAX_TOKENS_DEFAULT": "6", "MAX_TOKENS_LIMIT": "64", "MAX_BATCH": "4", "MAX_QUEUE": "8",
                     "REQUEST_TIMEOUT": "60", "EMBEDDING_MODEL": "zoo-qwen3-embedding", "HELPER_MAX_INPUTS": "5"})
    s.procs = {"engine": s.start_engine(ranks=RANKS), "api": s.start_api()}
    yield s
    for p in s.procs.values():
        p.stop()


def still_serving(s: Stack) -> None:
    """The example left the engine whole: a plain request runs to its end, then nothing is in flight."""
    assert s.procs["engine"].alive(), f"ENGINE DIED:\n{s.procs['engine'].log_tail()}"
    try:
        frames = wire.run(s.socket, PLAIN, timeout=30)
    except OSError as exc:
        raise AssertionError(f"ENGINE DIED: its socket fails ({exc}):\n{s.procs['engine'].log_tail()}") from None
    assert isinstance(frames[0], Started) and isinstance(frames[-1], Finish), frames
    wait_for(lambda: (lambda i: i.active == 0 and i.queued == 0)(wire.info(s.socket)), 15,
             "no request left running or queued")


@hostile_settings
@given(msg=hostile.generates)
def test_any_socket_request_runs_or_gets_a_4xx_and_the_engine_serves_on(small_stack, msg):
    choices = msg.params.n if isinstance(msg.params.n, int) and 0 < msg.params.n < 200 else 1
    # At most a dozen frames are read; closing the connection then cancels whatever still runs.
    frames = wire.run(small_stack.socket, msg, choices=choices, max_frames=12, timeout=60)
    assert frames, "the engine closed the connection without an answer"
    first = frames[0]
    event(f"{type(first).__name__} {getattr(first, 'param', '') or ''}")
    if isinstance(first, Error):
        assert 400 <= first.status < 500, first
        assert first.message and first.request_id == msg.request_id
    else:
        assert isinstance(first, Started), first
        errors = [f for f in frames if isinstance(f, Error)]
        assert not errors, errors
    still_serving(small_stack)


@hostile_settings
@given(body=hostile.chat_bodies)
def test_any_chat_body_runs_or_gets_a_4xx_and_the_engine_serves_on(small_stack, body):
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", small_stack.base_url + "/v1/chat/completions", content=json.dumps(body, allow_nan=True),
            headers={"Content-Type": "application/json"}) as r:
        if r.status_code == 200 and body.get("stream"):
            for i, line in enumerate(r.iter_lines()):
                assert '"server_error"' not in line, line
                if i > 12:
                    break
        else:
            r.read()
            event(f"{r.status_code} {r.json()['error'].get('param') if r.status_code != 200 else ''}")
            assert r.status_code < 500, r.text
            if r.status_code != 200:
                error = r.json()["error"]
                assert error["message"] and error["type"], error
    still_serving(small_stack)


@hostile_settings
@given(body=hostile.schema_bodies)
def test_any_schema_with_reference_cycles_runs_or_gets_a_400_naming_it(small_stack, body):
    with httpx.Client(timeout=60) as http, http.stream(
            "POST", small_stack.base_url + "/v1/chat/completions", json=body) as r:
        r.read()
        event(f"{r.status_code}")
        if r.status_code == 200:
            assert '"error"' not in r.text, r.text  # a stream ends in data: {"error": ...} when it fails
        else:
            assert r.status_code == 400, r.text
            assert r.json()["error"]["param"] in ("response_format", "tools[0].function.parameters"), r.text
    still_serving(small_stack)


@hostile_settings
@given(msg=hostile.tokenizes | hostile.detokenizes)
def test_any_socket_tokenize_or_detokenize_answers_or_gets_a_4xx_and_the_engine_serves_on(small_stack, msg):
    frames = wire.run(small_stack.socket, msg, max_frames=1, timeout=60)
    assert frames, "the engine closed the connection without an answer"
    (answer,) = frames
    event(f"{type(answer).__name__} {getattr(answer, 'param', '') or ''}")
    if isinstance(answer, Error):
        assert 400 <= answer.status < 500 and answer.message, answer
    elif isinstance(msg, Tokenize):
        assert isinstance(answer, Tokenized), answer
        assert answer.max_model_len > 0 and all(0 <= t < hostile.VOCAB for t in answer.tokens)
        assert (answer.token_strs is not None) == msg.return_token_strs
    else:
        assert isinstance(answer, Detokenized), answer
    still_serving(small_stack)


@hostile_settings
@given(msg=hostile.mostly(hostile.embeds, hostile.reranks, odds=4))
def test_any_socket_embed_or_rerank_answers_or_gets_a_4xx_and_the_engine_serves_on(small_stack, msg):
    frames = wire.run(small_stack.socket, msg, max_frames=1, timeout=60)
    assert frames, "the engine closed the connection without an answer"
    answer = frames[0]
    event(f"{type(answer).__name__} {getattr(answer, 'param', '') or ''}")
    if isinstance(answer, Error):  # a Rerank: no reranker is configured here, 404
        assert 400 <= answer.status < 500 and answer.message and answer.request_id == msg.request_id, answer
    else:
        assert isinstance(answer, Embedded) and isinstance(msg, Embed), answer
        assert answer.dimensions == (msg.dimensions or 64) and answer.embeddings
    still_serving(small_stack)


@hostile_settings
@given(data=st.tuples(st.just("/tokenize"), hostile.tokenize_bodies)
       | st.tuples(st.just("/detokenize"), hostile.detokenize_bodies))
def test_any_tokenize_or_detokenize_body_answers_or_gets_a_4xx_and_the_engine_serves_on(small_stack, data):
    path, body = data
    with httpx.Client(timeout=60) as http:
        r = http.post(small_stack.base_url + path, content=json.dumps(body, allow_nan=True),
                      headers={"Content-Type": "application/json"})
    event(f"{path} {r.status_code} {r.json()['error'].get('param') if r.status_code != 200 else ''}")
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert r.json()["error"]["message"], r.text
    still_serving(small_stack)


def _special_tokens(small_stack: Stack, body: dict) -> tuple[int, int]:
    """(status, how many of the prompt's tokens are special) for /tokenize of body's chat."""
    with httpx.Client(timeout=60) as http:
        r = http.post(small_stack.base_url + "/tokenize", json={**body, "return_token_strs": True})
    assert r.status_code < 500, r.text
    strs = r.json()["token_strs"] if r.status_code == 200 else []
    return r.status_code, sum(s in hostile.SPECIAL_TOKENS for s in strs)


@hostile_settings
@given(body=hostile.typed_chats)
def test_special_tokens_text_in_a_chat_adds_no_special_token(small_stack, body):
    status, typed = _special_tokens(small_stack, body)
    event(f"/tokenize {status}")
    if status == 200:
        assert _special_tokens(small_stack, hostile.without_specials(body)) == (200, typed)
