"""`python -m bench.ab --against REV`: this checkout's server against another commit's, taking turns.

A change that should make serving faster is best judged against the code before it, on the same machine
at the same minutes: this starts our server (engine + API) from this checkout and from REV (checked out
into a temporary git worktree), then, round after round, sends each the same load in alternating order:
c concurrent streamed chat requests (aggregate tok/s, every token over the time from the first request
to the last token) and one stream (decode tok/s). Ratios are this checkout over REV, medians of the
per-round ratios. Prompts are bench/run.py's, new ones each round.

    python -m bench.ab --against HEAD~3 --rounds 6
    python -m bench.ab --against HEAD~3 --ranks 2 --concurrency 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import clients, cpu, servers  # noqa: E402
from bench.interleaved import in_turn, paired  # noqa: E402
from bench.run import eos_token_ids, prompt, resolve_model  # noqa: E402


def report(rounds: list[dict[str, dict[str, float]]], rev: str, concurrency: int) -> str:
    lines = [f"| round | c={concurrency} this | c={concurrency} {rev} | one stream this | one stream {rev} |",
             "|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        lines.append(f"| {i} | {r['batch']['this']:.1f} | {r['batch']['rev']:.1f} | "
                     f"{r['single']['this']:.1f} | {r['single']['rev']:.1f} |")
    lines += ["", "| paired ratio this / " + rev + " (median over rounds) | value |", "|---|---|",
              f"| aggregate tok/s, {concurrency} streams | {paired([r['batch'] for r in rounds], 'this', 'rev'):.3f} |",
              f"| decode tok/s, one stream | {paired([r['single'] for r in rounds], 'this', 'rev'):.3f} |"]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", required=True, help="the commit (or branch, tag) to compare with")
    parser.add_argument("--model", default="demo-small", help="demo-tiny, demo-small, or a local MLX model folder")
    parser.add_argument("--ranks", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--cache-dir", type=Path, default=servers.REPO / ".cache" / "models")
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    args = parser.parse_args()
    if args.ranks < 1 or args.rounds < 1 or args.concurrency < 1:
        parser.error("--ranks, --rounds and --concurrency must be at least 1")
    rev = subprocess.run(["git", "-C", str(servers.REPO), "rev-parse", "--short", args.against],
                         capture_output=True, text=True)
    if rev.returncode != 0:
        parser.error(f"--against {args.against!r} is not a commit of this repository: {rev.stderr.strip()}")
    rev_name = rev.stdout.strip()
    model_path, model_name = resolve_model(args.model, args.cache_dir)
    bias = {t: -100.0 for t in eos_token_ids(model_path)}
    work = servers.Workdir()
    tree = Path(tempfile.mkdtemp(prefix="mcs-ab-", dir="/tmp")) / "tree"
    subprocess.run(["git", "-C", str(servers.REPO), "worktree", "add", "--detach", "-q", str(tree), rev_name],
                   check=True)
    this_repo, started = servers.REPO, []
    rounds: list[dict[str, dict[str, float]]] = []
    try:
        this = servers.start_ours(work, model_name, args.cache_dir, args.ranks)
        started.append(this)
        servers.REPO = tree  # the other server runs the other commit's code
        try:
            other = servers.start_ours(work, model_name, args.cache_dir, args.ranks)
        finally:
            servers.REPO = this_repo
        started.append(other)
        model_id = httpx.get(this.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        sides = {"this": this, "rev": other}
        for i in range(args.rounds):
            contents = [prompt(300_000 + 1000 * i + k) for k in range(args.concurrency)]

            def aggregate(side: str) -> float:
                res = clients.load(sides[side].base_url, [clients.chat(c, args.max_tokens, bias, model_id)
                                                          for c in contents], args.concurrency)
                if res.errors:
                    raise RuntimeError(f"{side}: {res.errors[0]}")
                return res.aggregate_tps

            def decode(side: str) -> float:
                one = clients.load(sides[side].base_url, [clients.chat(prompt(400_000 + i), args.max_tokens, bias,
                                                                       model_id)], 1).samples[0]
                if not one.ok:
                    raise RuntimeError(f"{side}: {one.error}")
                return one.decode_tps

            cpu.wait_quiet(0.25, 20.0)
            # in alternating order: round i starts with the i-th side
            batch = in_turn(i, {side: (lambda side=side: aggregate(side)) for side in sides})
            single = in_turn(i, {side: (lambda side=side: decode(side)) for side in sides})
            rounds.append({"batch": batch, "single": single})
            print(f"round {i + 1}/{args.rounds}: c={args.concurrency} this {batch['this']:.1f}, {rev_name} "
                  f"{batch['rev']:.1f}; one stream this {single['this']:.1f}, {rev_name} {single['rev']:.1f}",
                  file=sys.stderr, flush=True)
    finally:
        for s in started:
            s.stop()
        work.finish(False)
        subprocess.run(["git", "-C", str(this_repo), "worktree", "remove", "--force", str(tree)], check=False)
        subprocess.run(["rm", "-rf", str(tree.parent)], check=False)
    print(f"## This checkout against {rev_name}: {model_name}, {args.ranks} rank(s), max_tokens {args.max_tokens}\n")
    print(report(rounds, rev_name, args.concurrency))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-ab-{rev_name}-{args.ranks}r.json"
    path.write_text(json.dumps({"against": rev_name, "ranks": args.ranks, "concurrency": args.concurrency,
                                "max_tokens": args.max_tokens, "rounds": rounds}, indent=1))
    print(f"\nResults: {servers.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
