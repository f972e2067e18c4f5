"""Continuous batching: concurrency never changes a request's output, drops free their slots."""

from __future__ import annotations

import concurrent.futures as cf
from contextlib import contextmanager

import httpx
import openai
from tests.harness import Stack, wait_for

# the demo model's EOS ids banned: a stream that runs to its max_tokens
ENDLESS = {"model": "default", "prompt": "hi", "stream": True, "logit_bias": {"0": -100, "2": -100}}
WORDS = "the quick brown fox jumps over a lazy dog while seven cats watch from the warm roof".split()


def prompt(i: int) -> str:
    return " ".join(WORDS[(i * 3 + k) % len(WORDS)] for k in range(3 + 2 * i))


@contextmanager
def serving(**extra: str):
    """An engine and API of the test's own with these settings, both stopped when it ends."""
    s = Stack(extra=extra)
    engine, api = s.start_engine(), s.start_api()
    try:
        yield s
    finally:
        api.stop()
        engine.stop()


def test_sixteen_concurrent_greedy_requests_equal_their_sequential_outputs(client):
    def run(i: int) -> str:
        r = client.completions.create(model="default", prompt=prompt(i), max_tokens=8 + 3 * i, temperature=0)
        return r.choices[0].text

    sequential = [run(i) for i in range(16)]
    with cf.ThreadPoolExecutor(16) as pool:
        concurrent = list(pool.map(run, range(16)))
    assert concurrent == sequential


def test_dropping_half_of_twenty_streams_leaves_the_rest_intact(client, stack):
    body = {"model": "default", "max_tokens": 40, "temperature": 0, "stream": True}
    expected = {i: client.completions.create(model="default", prompt=prompt(i), max_tokens=40,
                                             temperature=0).choices[0].text for i in range(10)}

    def stream(i: int) -> str | None:
        with httpx.Client(timeout=60) as http:
            with http.stream("POST", stack.base_url + "/v1/completions", json={**body, "prompt": prompt(i)}) as r:
                assert r.status_code == 200
                text = []
                for n, line in enumerate(r.iter_lines()):
                    if i >= 10 and n >= 3:
                        return None  # drop this client mid-generation
                    if line.startswith("data: {"):
                        import json

                        chunk = json.loads(line[6:])
                        if chunk["choices"]:
                            text.append(chunk["choices"][0]["text"])
                return "".join(text)

    with cf.ThreadPoolExecutor(20) as pool:
        results = list(pool.map(stream, range(20)))
    assert {i: results[i] for i in range(10)} == expected
    wait_for(lambda: stack.probe()["active"] == 0, 10, "active sequences to return to 0")


def test_full_queue_answers_429_with_retry_after_and_the_engine_keeps_serving():
    long = {**ENDLESS, "max_tokens": 3000}
    with serving(MAX_BATCH="1", MAX_QUEUE="1") as s:
        with httpx.Client(timeout=30) as http, http.stream("POST", s.base_url + "/v1/completions", json=long) as a:
            # Keep the line iterators referenced: a collected iterator closes its response.
            lines_a = a.iter_lines()
            next(lines_a)
            wait_for(lambda: s.probe()["active"] == 1, 10, "the first request to run")
            with http.stream("POST", s.base_url + "/v1/completions", json=long) as b:
                assert b.status_code == 200  # admitted: it waits in the queue
                lines_b = b.iter_lines()
                wait_for(lambda: s.probe()["queued"] == 1, 10, "the second request to queue")
                r = http.post(s.base_url + "/v1/completions", json={**long, "stream": False})
                assert r.status_code == 429
                assert int(r.headers["Retry-After"]) >= 1
                assert r.json()["error"]["type"]
                del lines_b
            del lines_a
        wait_for(lambda: s.probe()["active"] == 0 and s.probe()["queued"] == 0, 10, "the engine to drain")
        with openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0) as client:
            assert client.completions.create(model="default", prompt="hi", max_tokens=3).usage.completion_tokens


def test_cancel_while_queued_never_runs():
    long = {**ENDLESS, "max_tokens": 3000}
    with serving(MAX_BATCH="1") as s:
        with httpx.Client(timeout=30) as http, http.stream("POST", s.base_url + "/v1/completions", json=long) as a:
            lines_a = a.iter_lines()
            next(lines_a)
            with http.stream("POST", s.base_url + "/v1/completions", json=long) as b:
                assert b.status_code == 200
                wait_for(lambda: s.probe()["queued"] == 1, 10, "the second request to queue")
            wait_for(lambda: s.probe()["queued"] == 0, 10, "the queued request to be withdrawn")
            assert s.probe()["active"] == 1
            del lines_a


def test_request_past_request_timeout_ends_with_an_error_and_frees_its_slot():
    body = {**ENDLESS, "max_tokens": 4000}
    with serving(REQUEST_TIMEOUT="1.5") as s:
        with httpx.Client(timeout=30) as http, http.stream("POST", s.base_url + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            lines = [line for line in r.iter_lines() if line]
        assert lines[-1] == "data: [DONE]"
        assert "timeout" in lines[-2] and '"error"' in lines[-2]
        wait_for(lambda: s.probe()["active"] == 0, 10, "the timed-out request to leave the batch")
