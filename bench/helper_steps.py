"""`python -m bench.helper_steps`: what helper work costs the served model's decode.

One stream decodes (greedy, max_tokens fixed) alone, then again while another client embeds a large batch over
and over (inputs of ~100 tokens each through /v1/embeddings) until the stream ends. Rank 0 runs helper work
between two steps in slices of at most HELPER_TOKENS_PER_STEP input tokens (padding included), so the gap between
two tokens of the stream grows by at most one slice. For each budget asked, a fresh engine; the table gives the
stream's token gaps (client side, median / p95 / max) alone and beside the helper, and the helper's throughput.

    python -m bench.helper_steps                                  # demo-small served, demo-small as the embedder
    python -m bench.helper_steps --budgets 128,512,2048 --inputs 256
    python -m bench.helper_steps --ranks 2 --helper-rank 1 --budgets 512   # the embedder on rank 1 of two
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from tests.harness import Stack  # noqa: E402

WORDS = ("the quick brown fox jumps over a lazy dog while embeddings run beside the served model and its "
         "decode keeps going step after step ").split()


def texts(n: int, words: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words)) + f" {i}" for i in range(n)]


def stream_gaps(base: str, max_tokens: int) -> list[float]:
    """Seconds between successive content chunks of one greedy streamed chat."""
    body = {"model": "default", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True}
    arrivals = []
    with httpx.Client(timeout=600) as http, http.stream("POST", base + "/v1/chat/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"content":"' in line:
                arrivals.append(time.perf_counter())
    return [b - a for a, b in zip(arrivals, arrivals[1:])]


def embed_until(base: str, batch: list[str], stop: threading.Event, out: dict) -> None:
    with httpx.Client(timeout=600) as http:
        while not stop.is_set():
            r = http.post(base + "/v1/embeddings", json={"model": "default", "input": batch})
            r.raise_for_status()
            out["inputs"] = out.get("inputs", 0) + len(batch)
            out["tokens"] = out.get("tokens", 0) + r.json()["usage"]["prompt_tokens"]


def ms(values: list[float], q: float) -> float:
    values = sorted(values)
    return 1000 * values[min(len(values) - 1, int(q * len(values)))]


def measure(args, budget: int) -> dict:
    s = Stack(extra={"MODEL": args.model, "EMBEDDING_MODEL": args.embedder, "HELPER_TOKENS_PER_STEP": str(budget),
                     "WATCHDOG_TIMEOUT": "600", "MAX_TOKENS_DEFAULT": "0"})
    # HOSTS names the ranks for the engine alone here, so the API (one host) is not told of a helper rank
    procs = [s.start_engine(ranks=args.ranks, timeout=600, HELPER_RANK=str(args.helper_rank)), s.start_api()]
    try:
        batch = texts(args.inputs, args.words)
        stream_gaps(s.base_url, 8)  # warm up both paths
        httpx.post(s.base_url + "/v1/embeddings", json={"model": "default", "input": batch[:4]}, timeout=600)
        alone = stream_gaps(s.base_url, args.max_tokens)
        stop, work = threading.Event(), {}
        helper = threading.Thread(target=embed_until, args=(s.base_url, batch, stop, work))
        started = time.perf_counter()
        helper.start()
        time.sleep(0.5)  # the first batch is queued before the stream starts
        beside = stream_gaps(s.base_url, args.max_tokens)
        stop.set()
        helper.join(600)
        seconds = time.perf_counter() - started
    finally:
        for p in reversed(procs):
            p.stop()
    return {"budget": budget, "alone": alone, "beside": beside, "inputs_per_s": work.get("inputs", 0) / seconds,
            "tokens_per_s": work.get("tokens", 0) / seconds}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-small")
    parser.add_argument("--embedder", default="demo-small", help="EMBEDDING_MODEL (a qwen3 folder or zoo name)")
    parser.add_argument("--budgets", default="128,512,2048", help="HELPER_TOKENS_PER_STEP values")
    parser.add_argument("--inputs", type=int, default=256, help="inputs per embeddings request")
    parser.add_argument("--words", type=int, default=80, help="words per input (~1.3 tokens each)")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--ranks", type=int, default=1, help="local ranks of the engine (mlx.launch over the ring)")
    parser.add_argument("--helper-rank", type=int, default=0, help="HELPER_RANK: the rank the embedder runs on")
    args = parser.parse_args(argv)
    rows = [measure(args, int(b)) for b in args.budgets.split(",")]
    print(f"\nserved {args.model} on {args.ranks} rank(s), embedder {args.embedder} on rank {args.helper_rank}, "
          f"{args.inputs} inputs of {args.words} words per request, "
          f"stream of {args.max_tokens} tokens\n")
    print("| HELPER_TOKENS_PER_STEP | gap alone ms (median / p95 / max) | gap beside helper ms (median / p95 / max) "
          "| decode tok/s alone | beside | helper inputs/s | helper tokens/s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        a, b = r["alone"], r["beside"]
        print(f"| {r['budget']} | {ms(a, .5):.1f} / {ms(a, .95):.1f} / {ms(a, 1):.1f} | {ms(b, .5):.1f} / "
              f"{ms(b, .95):.1f} / {ms(b, 1):.1f} | {1 / statistics.mean(a):.1f} | {1 / statistics.mean(b):.1f} | "
              f"{r['inputs_per_s']:.1f} | {r['tokens_per_s']:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
