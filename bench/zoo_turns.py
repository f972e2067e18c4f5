"""`python -m bench.zoo_turns`: an agent's turn 2 on every zoo family, prefix cache on against off.

For each model, a cache-on and a cache-off server run side by side. Each gets turn 1 (a long system prompt and a
question), then turn 2 (the same conversation, the answer, a new question); the table gives turn 2's prompt
tokens, how many came from the cache, and turn 2's time to first token with the cache over without it, taking
turns between the two servers (`--reps` pairs, median). The token counts do not depend on the machine; the
TTFT ratio does (a shared 2-core host is noisy: quote it next to the counts).

    .venv/bin/python -m bench.zoo_turns [--reps 3] [--ranks 1] [--system-lines 80] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # `python bench/zoo_turns.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import agent_workload as wl  # noqa: E402
from bench.report import table  # noqa: E402
from bench.servers import REPO, Server, Workdir, start_ours  # noqa: E402

FAMILIES = ("llama", "qwen3", "qwen3-moe", "qwen3.5", "qwen3-next", "deepseek-v3", "gpt-oss", "glm4-moe",
            "ministral3")


def turn(server: Server, messages: list[dict], max_tokens: int) -> tuple[str, float, int, int]:
    """(answer, seconds to the first token, prompt tokens, cached tokens) of one streamed greedy turn."""
    body = {"model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    sent, first, text, usage = time.perf_counter(), None, "", {}
    with httpx.stream("POST", server.base_url + "/v1/chat/completions", json=body, timeout=1800) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{server.label}: HTTP {r.status_code}: {r.read()[:300]!r}")
        for line in r.iter_lines():
            if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                continue
            obj = json.loads(line[5:])
            for choice in obj.get("choices") or ():
                if first is None and ((choice.get("delta") or {}).get("content") or choice.get("finish_reason")):
                    first = time.perf_counter()
                text += (choice.get("delta") or {}).get("content") or ""
            usage = obj.get("usage") or usage
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return text, (first or time.perf_counter()) - sent, usage.get("prompt_tokens", 0), cached


def measure(name: str, ranks: int, reps: int, system: str, work: Workdir, cache_dir: Path) -> list[str]:
    """One table row for zoo model `name`."""
    servers = [start_ours(work, "zoo-" + name, cache_dir, ranks, PROMPT_CACHE_BYTES=v) for v in (str(256 << 20), "0")]
    try:
        ratios, row = [], None
        for rep in range(reps):
            # a tag of its own per repetition: turn 1 is never served from an earlier repetition's entries
            opening = wl.opening(f"[rep {rep}] " + system, wl.first_user())
            seconds = []
            for server in servers:
                answer, _, _, _ = turn(server, opening, 24)
                history = [*opening, {"role": "assistant", "content": answer}, {"role": "user", "content": wl.follow_up(2)}]
                _, ttft, prompt, cached = turn(server, history, 8)
                seconds.append(ttft)
                if server is servers[0]:
                    row = (prompt, cached)
            ratios.append(seconds[0] / seconds[1])
        prompt, cached = row
        return [name, str(prompt), str(cached), f"{100 * cached / max(1, prompt):.0f} %",
                f"{statistics.median(ratios):.2f}"]
    finally:
        for s in servers:
            s.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.zoo_turns", description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(FAMILIES), help="zoo models (default: every family)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--system-lines", type=int, default=80)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models")
    args = parser.parse_args(argv)
    system = wl.system_prompt(args.system_lines)
    work = Workdir()
    rows = []
    for name in args.names:
        rows.append(measure(name, args.ranks, args.reps, system, work, args.cache_dir))
        print("  " + " | ".join(rows[-1]), file=sys.stderr, flush=True)
    print(f"## Turn 2 of an agent conversation, zoo models, {args.ranks} rank(s), prefix cache on vs off\n")
    print(table(["model", "turn-2 prompt tokens", "cached", "cached share", "turn-2 TTFT on/off (median)"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
