"""Greedy answers of a zoo model served with SPECULATIVE set (1 rank or several), for comparing speculation on and
off across the zoo's cache kinds: plain KV, MLA's latent, MoE, quantized weights, and the kinds that fall back to
plain decoding (sliding window, linear attention)."""

from __future__ import annotations

import concurrent.futures as cf

import httpx

from tests.harness import Stack
from tests.speculative_runs import counters

# Repeated text: prompt lookup finds the answer's last tokens earlier in the prompt (or the answer) and proposes.
TEXT = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu " * 4
SYSTEM = "Repeat what the user says, word for word. " * 6


def _complete(http: httpx.Client, name: str, prompt: str, max_tokens: int, **more) -> dict:
    r = http.post("/v1/completions", json={"model": "zoo-" + name, "prompt": prompt, "max_tokens": max_tokens,
                                           "temperature": 0, **more})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def _chat(http: httpx.Client, name: str, messages: list[dict], max_tokens: int) -> str:
    r = http.post("/v1/chat/completions", json={"model": "zoo-" + name, "messages": messages, "temperature": 0,
                                                "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def zoo_answers(name: str, ranks: int, speculative: str, **settings: str) -> dict:
    """What one engine answers: a completion with its logprobs, two chat turns (the second starts from the first's
    prefix cache entry, which was stored after drafting), concurrent completions ending at max_tokens and at a stop
    string; then speculation's counters and the engine's log."""
    s = Stack(extra={"MODEL": "zoo-" + name})
    engine = s.start_engine(ranks=ranks, SPECULATIVE=speculative, NUM_DRAFT_TOKENS="6", **settings)
    try:
        api = s.start_api()
        try:
            with httpx.Client(base_url=s.base_url, timeout=300) as http:
                one = _complete(http, name, TEXT, 40, logprobs=2)
                messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TEXT}]
                first = _chat(http, name, messages, 30)
                messages += [{"role": "assistant", "content": first}, {"role": "user", "content": TEXT}]
                second = _chat(http, name, messages, 30)

                def together(i: int) -> str:
                    stop = {"stop": [one["text"][12:16]]} if i == 1 and len(one["text"]) > 16 else {}
                    return _complete(http, name, TEXT[i:], 20 + 9 * i, **stop)["text"]

                with cf.ThreadPoolExecutor(3) as pool:
                    concurrent = list(pool.map(together, range(3)))
                health = http.get("/health").json()["speculative"]
            assert s.probe() is not None  # no rank desynced or died
            spec = counters(s.base_url)
        finally:
            api.stop()
    finally:
        engine.stop()
    log = "".join(p.read_text(errors="replace") for p in s.root.glob("engine-*.log"))
    lp = one["logprobs"]
    return dict(texts=[one["text"], first, second, *concurrent], tokens=lp["tokens"],
                logprobs=lp["token_logprobs"], top=[sorted(t) for t in lp["top_logprobs"]], counters=spec,
                mode=health["mode"], log=log)


def assert_answers_equal(spec: dict, plain: dict) -> None:
    """Speculation changed nothing a client sees (texts, tokens, logprobs) and logged no error."""
    import pytest

    assert spec["texts"] == plain["texts"]
    assert spec["tokens"] == plain["tokens"] and spec["top"] == plain["top"]
    assert spec["logprobs"] == pytest.approx(plain["logprobs"], abs=1e-3)
    assert "ERROR" not in spec["log"] and "Traceback" not in spec["log"], spec["log"][-3000:]
