"""What storing the KV cache in 8 or 4 bits costs in quality, on real text: per-token KL divergence from the
full-precision KV, top-1 agreement and perplexity, by context position; and how often greedy answers stay the same.

    .venv/bin/python -m bench.kv_quality --model smollm2-135m --cache-dir ~/.cache/mlx-cluster-serve \\
        --tokens 3000 --configs off,8/64,4/64,8/32,4/32                    # in-process mlx-lm (QuantizedKVCache)
    .venv/bin/python -m bench.kv_quality --model smollm2-135m --cache-dir ~/.cache/mlx-cluster-serve \\
        --way api --tokens 3000 --configs off,8/64,4/64                    # our engine started with KV_BITS

`--way inprocess` runs the text through mlx-lm in chunks of the engine's prefill step, once per config over the
same chunks, each config with its own cache (`QuantizedKVCache(group, bits)` in every layer: each chunk's keys
and values are quantized as they land, before the chunk attends to them, as the engine does); the KL is over the
whole vocabulary. `--way api` starts one engine and API per config (`KV_BITS`, `KV_GROUP_SIZE`) and scores the
text through /v1/completions (echo, logprobs 20, max_tokens 0); the KL is then over the reference's 20 most likely
tokens plus one bucket for the rest, a lower bound on the full KL. Either way the first config is the reference.
Positions are bucketed by --edges (short context: the first bucket; long: the last). Then --prompts short chat
questions are answered greedily (--answer-tokens each) with the reference and with each other config.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# the engine's default PREFILL_TOKENS_PER_STEP: quantized chunks attend to themselves as in the engine
CHUNK = 512
TOP_N = 20

QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many days are there in a leap year?",
    "Explain in one sentence what photosynthesis is.",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me two tips for sleeping better.",
    "Who wrote Romeo and Juliet?",
    "What does a CPU do?",
    "Translate 'good morning' into Spanish.",
    "Why is the sky blue? Answer briefly.",
    "List the planets closest to the sun, in order.",
    "What is the boiling point of water in Celsius?",
    "Suggest a name for a pet turtle.",
    "Describe a cat in three words.",
    "What is the difference between weather and climate?",
]


@dataclass(frozen=True)
class Config:
    bits: int | None  # None: the model's own precision
    group: int = 64
    start: int | None = None  # in process only: the first `start` positions kept exact (quantized_kv_start)

    @classmethod
    def parse(cls, text: str) -> Config:
        """`off`, `8`, `4/32` (bits/group), `4/64@256` (the first 256 positions in full precision)."""
        if text == "off":
            return cls(None)
        text, _, start = text.partition("@")
        bits, _, group = text.partition("/")
        return cls(int(bits), int(group or 64), int(start) if start else None)

    def __str__(self) -> str:
        kept = "" if self.start is None else f", first {self.start} exact"
        return "float" if self.bits is None else f"{self.bits} bits / {self.group}{kept}"

    def env(self) -> dict[str, str]:
        if self.start is not None:
            raise SystemExit(f"{self}: the engine has no setting for exact first positions; use --way inprocess")
        return {"KV_BITS": "off" if self.bits is None else str(self.bits), "KV_GROUP_SIZE": str(self.group)}


@dataclass
class Scores:
    """Per position of the text (the first token has none): KL from the reference, top-1 equal to the
    reference's, the logprob of the text's own token."""
    kl: list[float] = field(default_factory=list)
    agree: list[bool] = field(default_factory=list)
    logprob: list[float] = field(default_factory=list)


def kl_top(ref: dict[str, float], other: dict[str, float]) -> float:
    """KL(ref || other) over ref's listed tokens plus one bucket for everything else: a lower bound on the full KL
    (merging tokens never raises a KL). A token `other` does not list gets at most its smallest listed probability."""
    floor = min(other.values())
    p = {t: math.exp(v) for t, v in ref.items()}
    q = {t: math.exp(other.get(t, floor)) for t in ref}
    # the rest's mass, kept positive: rounding can push a listed sum a hair past 1
    p_rest, q_rest = max(1.0 - sum(p.values()), 1e-12), max(1.0 - sum(q.values()), 1e-12)
    return sum(p[t] * (math.log(p[t]) - math.log(q[t])) for t in p) + p_rest * math.log(p_rest / q_rest)


def buckets(n: int, edges: list[int]) -> list[tuple[int, int]]:
    """[start, end) position ranges from the edges, the last one running to n; empty ranges dropped."""
    bounds = [e for e in edges if e < n] + [n]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if b > a]


def summary(s: Scores, start: int, end: int) -> tuple[float, float, float, float]:
    """Mean KL, its 99th percentile, top-1 agreement and perplexity over positions [start, end)."""
    kl = sorted(s.kl[start:end])
    agree = s.agree[start:end]
    lp = s.logprob[start:end]
    p99 = kl[min(len(kl) - 1, int(0.99 * len(kl)))]
    return sum(kl) / len(kl), p99, sum(agree) / len(agree), math.exp(-sum(lp) / len(lp))


def same_prefix(a: list, b: list) -> int:
    """How many leading items two answers share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- in-process (mlx-lm) ----

def make_cache(model, config: Config):
    from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache

    if config.bits is None:
        return make_prompt_cache(model)
    if config.start is not None:
        return [_head_exact_cache(config) for _ in model.layers]
    return [QuantizedKVCache(group_size=config.group, bits=config.bits) for _ in model.layers]


def _head_exact_cache(config: Config):
    """A float KVCache holding, from position config.start on, mx.quantize's values (quantized then dequantized,
    as they land): what a quantized cache that keeps its first positions exact would attend to."""
    import mlx.core as mx
    from mlx_lm.models.cache import KVCache

    def rounded(x, first: int):
        cut = min(x.shape[2], max(0, config.start - first))
        if cut == x.shape[2]:
            return x
        q = mx.quantize(x[:, :, cut:], group_size=config.group, bits=config.bits)
        tail = mx.dequantize(*q, group_size=config.group, bits=config.bits).astype(x.dtype)
        return mx.concatenate([x[:, :, :cut], tail], axis=2) if cut else tail

    class HeadExact(KVCache):
        def update_and_fetch(self, keys, values):
            return super().update_and_fetch(rounded(keys, self.offset), rounded(values, self.offset))

    return HeadExact()


def inprocess_scores(model, tokens: list[int], configs: list[Config]) -> list[Scores]:
    """Every config's scores, chunk by chunk side by side (full-vocabulary logprobs never all held at once)."""
    import mlx.core as mx

    caches = [make_cache(model, c) for c in configs]
    out = [Scores() for _ in configs]
    for s in range(0, len(tokens) - 1, CHUNK):
        chunk = tokens[s:s + CHUNK + 1]
        x, target = mx.array(chunk[:-1])[None], mx.array(chunk[1:])[:, None]
        ref = None
        for cache, scores in zip(caches, out):
            logits = model(x, cache=cache)[0].astype(mx.float32)
            lp = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
            ref = lp if ref is None else ref
            kl = (mx.exp(ref) * (ref - lp)).sum(axis=-1)
            agree = mx.argmax(lp, axis=-1) == mx.argmax(ref, axis=-1)
            mx.eval(kl, agree)
            scores.kl += kl.tolist()
            scores.agree += agree.tolist()
            scores.logprob += mx.take_along_axis(lp, target, axis=-1)[:, 0].tolist()
        print(f"  scored {min(s + CHUNK, len(tokens) - 1)}/{len(tokens) - 1} positions", file=sys.stderr, flush=True)
    return out


def inprocess_answer(model, tokenizer, question: str, config: Config, max_tokens: int) -> list[int]:
    """Greedy token ids of the chat answer, EOS ending it."""
    import mlx.core as mx

    prompt = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    cache = make_cache(model, config)
    logits = model(mx.array(prompt)[None], cache=cache)[:, -1]
    out: list[int] = []
    for _ in range(max_tokens):
        token = int(mx.argmax(logits, axis=-1).item())
        if token in tokenizer.eos_token_ids:
            break
        out.append(token)
        logits = model(mx.array([[token]]), cache=cache)[:, -1]
    return out


# ---- through the API ----

def api_scores(client, text: str) -> tuple[list[dict[str, float]], list[float]]:
    """The top-20 dicts and the text's own logprobs at every position after the first."""
    r = client.completions.create(model="default", prompt=text, echo=True, logprobs=TOP_N, max_tokens=0)
    lp = r.choices[0].logprobs
    return lp.top_logprobs[1:], lp.token_logprobs[1:]


def api_run(args, config: Config, text: str, questions: list[str]) -> tuple[list[dict], list[float], list[str], str]:
    """One engine and API with this config: the text's scores, the greedy answers, and the KV precision /health
    reports (so a config the engine ignores shows)."""
    import httpx
    import openai

    from tests.harness import Stack

    extra = {"MODEL": args.model, "MODEL_CACHE_DIR": str(args.cache_dir), "WATCHDOG_TIMEOUT": "1800",
             "REQUEST_TIMEOUT": "3600", "PROMPT_CACHE_BYTES": "0", **config.env()}
    stack = Stack(extra=extra)
    procs = [stack.start_engine(ranks=args.ranks, timeout=900), stack.start_api()]
    try:
        health = httpx.get(stack.base_url + "/health", timeout=30).json()
        with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=3600) as c:
            tops, lps = api_scores(c, text)
            answers = [c.chat.completions.create(
                model="default", messages=[{"role": "user", "content": q}], temperature=0,
                max_tokens=args.answer_tokens).choices[0].message.content for q in questions]
    finally:
        for p in reversed(procs):
            p.stop()
    return tops, lps, answers, kv_reported(health)


def kv_reported(health: dict) -> str:
    """Whatever /health says about the KV precision, wherever it says it; '?' when it says nothing."""
    found = [f"{k}={v}" for k, v in _walk(health)
             if "kv" in k.lower() and ("bit" in k.lower() or "precision" in k.lower())]
    return ", ".join(sorted(set(found))) or "?"


def _walk(node, prefix: str = ""):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _walk(v, f"{prefix}{k}.") if isinstance(v, dict | list) else [(f"{prefix}{k}", v)]
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v, prefix)


# ---- report ----

def print_quality(names: list[str], scores: list[Scores], edges: list[int], kl_note: str) -> None:
    n = len(scores[0].logprob)
    print(f"| KV | positions | mean KL ({kl_note}) | p99 KL | top-1 = float | perplexity | vs float |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for start, end in buckets(n, edges):
        base = summary(scores[0], start, end)[3]
        for name, s in zip(names, scores):
            kl, p99, agree, ppl = summary(s, start, end)
            print(f"| {name} | {start + 1}-{end} | {kl:.5f} | {p99:.4f} | {agree:.2%} | {ppl:.3f} | "
                  f"{ppl / base - 1:+.2%} |")
    sys.stdout.flush()


def print_answers(names: list[str], answers: list[list]) -> None:
    ref = answers[0]
    print(f"| KV | greedy answers identical to float | mean shared prefix (of float's length) |")
    print("|---|---:|---:|")
    for name, mine in zip(names[1:], answers[1:]):
        same = sum(a == b for a, b in zip(ref, mine))
        shared = sum(same_prefix(a, b) / max(1, len(a)) for a, b in zip(ref, mine)) / len(ref)
        print(f"| {name} | {same}/{len(ref)} | {shared:.0%} |")


def header(args, scores: list[Scores], started: float) -> None:
    print(f"{args.model}, {args.way}, {len(scores[0].logprob) + 1} tokens of {args.text.relative_to(REPO)} in one "
          f"sequence, prefill chunk {CHUNK}, {time.monotonic() - started:.0f} s\n", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="MODEL: a demo or zoo name, a path, a cached repo id")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "mlx-cluster-serve")
    ap.add_argument("--way", default="inprocess", choices=("inprocess", "api"))
    ap.add_argument("--ranks", type=int, default=1, help="--way api: the engine's ranks")
    ap.add_argument("--configs", default="off,8/64,4/64",
                    help="KV_BITS/KV_GROUP_SIZE[@N: the first N positions exact, in process], comma-separated; the first is the reference")
    ap.add_argument("--text", type=Path, default=REPO / "docs" / "cluster.md", help="the held text scored")
    ap.add_argument("--tokens", type=int, default=3000, help="about how many tokens of it, in one sequence (0: none)")
    ap.add_argument("--edges", default="0,512,2048", help="position buckets' starts")
    ap.add_argument("--prompts", type=int, default=len(QUESTIONS), help="greedy questions (0: none)")
    ap.add_argument("--answer-tokens", type=int, default=48)
    args = ap.parse_args(argv)

    from bench.perplexity import model_folder, text_of

    configs = [Config.parse(c) for c in args.configs.split(",")]
    names = [str(c) for c in configs]
    edges = [int(e) for e in args.edges.split(",")]
    questions = QUESTIONS[:args.prompts]
    started = time.monotonic()
    if args.way == "inprocess":
        from mlx_lm import load

        model, tokenizer = load(str(model_folder(args.model, args.cache_dir)))
        if args.tokens:  # 0: the greedy answers alone
            tokens = tokenizer.encode(text_of(args.tokens, args.text))[:args.tokens]
            scores = inprocess_scores(model, tokens, configs)
            header(args, scores, started)
            print_quality(names, scores, edges, "whole vocabulary")
        answers = [[inprocess_answer(model, tokenizer, q, c, args.answer_tokens) for q in questions] for c in configs]
    else:
        text = text_of(args.tokens, args.text)
        runs = [api_run(args, c, text, questions) for c in configs]
        for name, run in zip(names, runs):
            print(f"{name}: /health reports {run[3]}", file=sys.stderr)
        ref_tops = runs[0][0]
        scores = []
        for tops, lps, _, _ in runs:
            agree = [max(r, key=r.get) == max(t, key=t.get) for r, t in zip(ref_tops, tops)]
            scores.append(Scores([kl_top(r, t) for r, t in zip(ref_tops, tops)], agree, lps))
        answers = [run[2] for run in runs]
        header(args, scores, started)
        print_quality(names, scores, edges, f"top {TOP_N} + rest")
    if questions:
        print(f"\n{len(questions)} chat questions, greedy, up to {args.answer_tokens} tokens:\n")
        print_answers(names, answers)
    return 0


if __name__ == "__main__":
    sys.exit(main())
