"""`python -m bench.needle_ranks`: a needle at 64k tokens on 1 and 2 ranks, tensor and pipeline, prefix cache on
and off: the same greedy tokens as 1 rank, the prefill's time and each rank's peak memory.

A zoo model reads the haystack (default zoo-ministral3: 262,144 positions, sliding-window and full attention
layers, and both shard() and pipeline() on 2 ranks). Its weights are random, so "answered the same" means the same
greedy tokens as 1 rank with the prefix cache off. A needle sentence opens the haystack and a question follows it;
the second request adds a second question to the first's prompt, as an agent's next turn extends its last: with
the cache on it reuses the first prompt (its cached_tokens are shown), with the cache off it computes it again.
Prefill is the first request's time to its first token. Peak memory is each rank's own report (mx.get_peak_memory,
/health's rank_states), read once the ranks have reported after the last request.

    python -m bench.needle_ranks --tokens 65536
    python -m bench.needle_ranks --tokens 8192 --runs 1:single:off,2:tensor:off
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import cpu, servers  # noqa: E402
from bench.needle import stream  # noqa: E402
from bench.run import resolve_model  # noqa: E402

NEEDLE = "Remember this: the vault code is 4711 and the vault is in Oslo. "
FILLER = "The cluster hums along; ranks exchange partial sums and nothing of note happens. "
QUESTIONS = [" Question: what is the vault code? Answer:", " Question: where is the vault? Answer:"]
# ranks:parallel:prefix cache; the first is the reference the others are compared with
RUNS = "1:single:off,1:single:on,2:tensor:off,2:tensor:on,2:pipeline:off,2:pipeline:on"
MIB = 1024 ** 2


def prompts(model_path: Path, tokens: int) -> list[list[int]]:
    """The haystack of `tokens` token ids, needle first, then the first question; the second prompt is the first
    followed by the second question (an agent's next turn extends its last prompt)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(model_path / "tokenizer.json"))
    haystack, repeats = [], tokens // len(tok.encode(FILLER).ids) + 1
    while len(haystack) < tokens:  # repeated text tokenizes shorter than its pieces apart
        haystack = tok.encode(NEEDLE + FILLER * repeats).ids
        repeats *= 2
    first = haystack[:tokens] + tok.encode(QUESTIONS[0]).ids
    return [first, first + tok.encode(QUESTIONS[1]).ids]


def complete(base_url: str, ids: list[int], max_tokens: int) -> dict:
    """One streamed greedy completion: its text, the time to its first token, and the prompt tokens it reused."""
    body = {"model": "default", "prompt": ids, "max_tokens": max_tokens, "temperature": 0}
    out = stream(base_url + "/v1/completions", body, lambda choice: choice.get("text"))
    if "error" in out:
        return out
    usage = out["usage"]
    return {"text": out["text"], "ttft_s": out["ttft_s"] or out["total_s"], "prompt_tokens": usage.get("prompt_tokens"),
            "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)}


def peak_memory(base_url: str, after: float, timeout: float = 30.0) -> list[int]:
    """Each rank's peak MLX memory, from a report the ranks made after `after` (time.monotonic)."""
    deadline = time.monotonic() + timeout
    while True:
        health = httpx.get(base_url + "/health", timeout=10).json()
        states = health.get("rank_states") or []
        now = time.monotonic()
        if states and all(now - s["report_age"] > after for s in states) or now > deadline:
            return [s["peak_memory"] for s in sorted(states, key=lambda s: s["rank"])]
        time.sleep(0.5)


def run(work: servers.Workdir, model: str, cache_dir: Path, spec: str, ids: list[list[int]], max_tokens: int,
        watchdog: str = "") -> dict:
    ranks, parallel, cache = spec.split(":")
    settings = {"WATCHDOG_TIMEOUT": watchdog} if watchdog else {}
    if cache == "off":
        settings["PROMPT_CACHE_BYTES"] = "0"
    if int(ranks) > 1:
        settings["PARALLEL"] = parallel
    server = servers.start_ours(work, model, cache_dir, int(ranks), timeout=600, **settings)
    try:
        load0 = cpu.load_average()
        answers = [complete(server.base_url, q, max_tokens) for q in ids]
        peaks = peak_memory(server.base_url, time.monotonic())
    finally:
        server.stop()
    return {"run": spec, "answers": answers, "peak_memory": peaks, "load_average": load0}


def table(rows: list[dict], model: str, tokens: int) -> str:
    reference = [a.get("text") for a in rows[0]["answers"]]
    out = [f"## Needle at {tokens} tokens: {model}, greedy, a question, then a second one after it\n",
           "| ranks | parallel | prefix cache | same tokens as 1 rank, cache off | prefill (q1 TTFT) s | q2 TTFT s "
           "(cached tokens) | peak memory per rank MiB | load average |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ranks, parallel, cache = r["run"].split(":")
        errors = [a["error"] for a in r["answers"] if "error" in a]
        if errors:
            out.append(f"| {ranks} | {parallel} | {cache} | error: {errors[0]} | – | – | – | {r['load_average']:.1f} |")
            continue
        q1, q2 = r["answers"]
        same = "yes" if [a["text"] for a in r["answers"]] == reference else "**no**"
        peaks = " / ".join(f"{p / MIB:.0f}" for p in r["peak_memory"])
        out.append(f"| {ranks} | {parallel} | {cache} | {same} | {q1['ttft_s']:.1f} | {q2['ttft_s']:.1f} "
                   f"({q2['cached_tokens']}) | {peaks} | {r['load_average']:.1f} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.needle_ranks", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="zoo-ministral3")
    parser.add_argument("--tokens", type=int, default=65536, help="haystack tokens (the needle among them)")
    parser.add_argument("--runs", default=RUNS, help="ranks:parallel:cache, comma-separated; the first is the "
                                                     "reference (default: %(default)s)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--watchdog", default="", help="WATCHDOG_TIMEOUT of each engine, seconds (default: the "
                                                        "engine's own)")
    parser.add_argument("--cache-dir", type=Path, default=Path("~/.cache/mlx-cluster-serve").expanduser())
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args(argv)
    model_path, model_name = resolve_model(args.model, args.cache_dir)
    ids = prompts(model_path, args.tokens)
    work, rows = servers.Workdir(), []
    try:
        for spec in [s for s in args.runs.split(",") if s]:
            row = run(work, model_name, args.cache_dir, spec, ids, args.max_tokens, args.watchdog)
            print(f"[needle_ranks] {json.dumps(row)}", file=sys.stderr, flush=True)
            rows.append(row)
    finally:
        work.finish(args.keep_logs)
    print(table(rows, model_name, args.tokens))
    servers.save(args.out, f"needle-ranks-{args.tokens}", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
