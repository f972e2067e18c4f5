"""`python -m bench.sibling_turns`: N conversations sharing one system prompt take turns; tokens computed per turn.

Several users (or an agent's subagents) on one cluster send conversations that share a long system prompt and
interleave: A1, B1, C1, A2, B2, C2, ... Each turn resends the whole conversation. With the prefix cache, a turn
should compute only what is new since that conversation's last turn (the last answer and the new user message),
however many other conversations came in between; without it, the whole history. This prints, for N = 1, 4,
12 conversations, the median prompt tokens computed at each turn with the cache on and off, side by side
from one run (`prompt_tokens - cached_tokens` of each reply; these counts do not depend on the machine's speed).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

if __package__ in (None, ""):  # `python bench/sibling_turns.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import agent_workload as wl  # noqa: E402
from bench.report import table  # noqa: E402
from bench.run import resolve_model  # noqa: E402
from bench.servers import REPO, Server, Workdir, start_ours  # noqa: E402

# the demo models' EOS ids are banned so every answer runs to max_tokens: turns differ only by what is cached
NO_EOS = {"0": -100, "2": -100}


def ask(server: Server, messages: list[dict], max_tokens: int) -> tuple[str, int]:
    """(answer, prompt tokens computed) of one greedy chat turn."""
    r = httpx.post(server.base_url + "/v1/chat/completions", timeout=1800, json={
        "model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0, "logit_bias": NO_EOS})
    if r.status_code != 200:
        raise RuntimeError(f"{server.label}: HTTP {r.status_code}: {r.text[:300]}")
    body = r.json()
    usage = body["usage"]
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return body["choices"][0]["message"]["content"] or "", usage["prompt_tokens"] - cached


def interleave(server: Server, system: str, n: int, turns: int, max_tokens: int) -> list[list[int]]:
    """computed[turn][conversation] for n conversations taking turns on one server."""
    chats = [wl.opening(system, wl.first_user(f"test_case_{c}")) for c in range(n)]
    computed = []
    for turn in range(1, turns + 1):
        row = []
        for c in range(n):
            answer, work = ask(server, chats[c], max_tokens)
            row.append(work)
            chats[c] = [*chats[c], {"role": "assistant", "content": answer},
                        {"role": "user", "content": wl.follow_up(turn + 1)}]
        computed.append(row)
    return computed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.sibling_turns", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-tiny", help="demo-tiny, demo-small, or a local MLX model folder")
    parser.add_argument("--conversations", default="1,4,12", help="comma-separated N (default 1,4,12)")
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--system-lines", type=int, default=160, help="guidelines in the shared system prompt")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per answer")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models")
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.conversations.split(",")]
    _, model_env = resolve_model(args.model, args.cache_dir)
    system = wl.system_prompt(args.system_lines)
    work = Workdir()
    servers = []
    try:
        servers.append(start_ours(work, model_env, args.cache_dir, args.ranks, PROMPT_CACHE_BYTES=str(256 << 20)))
        servers.append(start_ours(work, model_env, args.cache_dir, args.ranks, PROMPT_CACHE_BYTES="0"))
        header = ["N", "cache"] + [f"turn {t}" for t in range(1, args.turns + 1)] + ["turns 2+ total"]
        rows = []
        for n in counts:
            # a tag of its own per N, so no N starts from what an earlier one cached
            tagged = f"[run {n}] " + system
            for label, server in (("on", servers[0]), ("off", servers[1])):
                computed = interleave(server, tagged, n, args.turns, args.max_tokens)
                medians = [statistics.median(row) for row in computed]
                rows.append([str(n), label] + [f"{m:.0f}" for m in medians]
                            + [str(sum(sum(row) for row in computed[1:]))])
                print(f"  N={n} cache {label}: {medians}", file=sys.stderr, flush=True)
        print(f"## Prompt tokens computed per turn (median over conversations), {args.model}, "
              f"{args.ranks} rank(s), {args.max_tokens}-token answers\n")
        print(table(header, rows))
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
