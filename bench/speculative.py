"""`python -m bench.speculative`: speculative decoding on and off, side by side, on 1 and 2 ranks.

For each rank count it starts our engine + API once per SPECULATIVE mode (off, ngram, draft, mtp) at the same
time, then sends each the same workloads, taking turns (round i starts with the i-th mode). mtp needs a model with
multi-token-prediction heads (`--model zoo-deepseek-v3-mtp-trained`) and, on several ranks, `--parallel tensor`
(every mode then runs tensor parallel, so the ratios compare like with like):

- copy: an agent-like answer that copies from its prompt. A random-weight demo model does not copy a file it is
  shown, but a short block of random tokens repeated many times (`--block` tokens, `--reps` times, as token ids
  through /v1/completions) makes its greedy continuation repeat stretches of it and of itself; the acceptance
  column says how much it copied. `--requests` streams, one at a time.
- chat: bench.run's short chat prompts, ordinary text. `--requests` streams, one at a time.
- copy x8, chat x8: `--concurrency` streams of each at once (aggregate tok/s).
- rewrite file, repeat JSON (`--workloads`): what a coding agent sends a real model (bench/copy_turns.py): ~40
  lines of Python to give back with one function renamed, a JSON document to give back with one field changed;
  `--requests` chat streams, one at a time. Greedy answers are checked identical to off's for each.

Every request is greedy, asks for `--max-tokens` and suppresses the model's EOS ids. Per server and workload:
tokens per target forward pass = generated tokens / (generated - accepted drafts) (every forward pass gives a
sequence one token of its own plus the drafts it accepted; the first token's prefill counts as one), the
acceptance (accepted / proposed, from /health's `speculative`), the decode rate (one stream: tokens after the
first over the time between first and last chunk; several: every token over the wave's wall time), its ratio
to SPECULATIVE=off measured in the same round, decoding positions computed per generated token (/health's
`speculative.decode_positions`: a verify pass computes every row as wide as the batch's widest draft; plain
decoding one position per token; machine-independent, unlike the rates), and CPU ms per generated token (every process of the server,
from /proc). A greedy answer is checked byte-identical to off's once per server.

    python -m bench.speculative                          # demo-small, 1 and 2 ranks: ~3 min here
    python -m bench.speculative --rounds 3 --max-tokens 128   # steadier ratios: ~10 min
    python -m bench.speculative --model smollm2-135m --cache-dir ~/.cache/mlx-cluster-serve --ranks 1 \
        --modes off,ngram --workloads "rewrite file,repeat JSON,chat" --max-tokens 160   # a real model's copies
    python -m bench.speculative --model zoo-deepseek-v3-mtp-trained --modes off,ngram,draft,mtp --parallel tensor \
        --workloads "copy,chat x8"                     # a trained MTP head beside the other proposers
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import clients, copy_turns, cpu, servers  # noqa: E402
from bench.run import eos_token_ids, prompt, resolve_model  # noqa: E402

WORKLOADS = ("copy", "chat", "copy x8", "chat x8", *copy_turns.TURNS)


@dataclass
class Cell:
    """One server's figures for one workload, summed over rounds."""

    tokens: int = 0
    accepted: int = 0
    proposed: int = 0
    positions: int = 0  # decoding positions the forward passes computed
    cpu_s: float = 0.0
    rates: list[float] = field(default_factory=list)  # one per round
    errors: list[str] = field(default_factory=list)

    def tokens_per_forward(self) -> float:
        forwards = self.tokens - self.accepted
        return self.tokens / forwards if forwards > 0 else float("nan")

    def positions_per_token(self) -> float:
        return self.positions / self.tokens if self.tokens else float("nan")

    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")

    def cpu_ms_per_token(self) -> float:
        return 1000.0 * self.cpu_s / self.tokens if self.tokens else float("nan")


def copy_prompt(i: int, block: int, reps: int, vocab: list[int]) -> list[int]:
    """The i-th copy prompt: `block` random token ids of `vocab` (seeded by i) repeated `reps` times, then the
    block's first eight again, so the continuation starts mid-copy."""
    rng = random.Random(1000 + i)
    tokens = [rng.choice(vocab) for _ in range(block)]
    return tokens * reps + tokens[:8]


def plain_tokens(model_path: Path) -> list[int]:
    """Token ids that decode alone to printable ASCII: a copy of them streams as it is decoded (a byte token
    would hold the text back until its character completes, and one stream's decode rate could not be timed)."""
    from mlx_lm.utils import load_tokenizer

    tok = load_tokenizer(model_path)
    vocab = json.loads((model_path / "config.json").read_text())["vocab_size"]
    out = []
    for t in range(vocab):
        text = tok.decode([t])
        if text.strip() and text.isascii() and text.isprintable():
            out.append(t)
    return out


def draft_model_for(model_name: str, model_path: Path, wanted: str, cache_dir: Path) -> tuple[str, str]:
    """(DRAFT_MODEL, what the table says about it): `wanted` when its tokenizer matches the model's, else the model
    itself (every proposal accepted: the ceiling of a draft model)."""
    from mlx_lm.utils import load_tokenizer

    from engine.speculative.draft import tokenizer_mismatch

    if wanted and wanted != model_name:
        draft_path, draft_name = resolve_model(wanted, cache_dir)
        why = tokenizer_mismatch(load_tokenizer(draft_path), load_tokenizer(model_path), draft_name, model_name)
        if why is None:
            return draft_name, f"DRAFT_MODEL={draft_name}"
        print(f"[spec] {why}: drafting with the model itself instead", file=sys.stderr, flush=True)
    return model_name, f"DRAFT_MODEL={model_name} (the model itself: every proposal accepted, the ceiling)"


def spec_counts(server: servers.Server) -> tuple[int, int, int]:
    """(proposed, accepted) draft tokens and decoding positions computed since the engine started, from /health."""
    spec = httpx.get(server.base_url + "/health", timeout=10).json().get("speculative") or {}
    return (int(spec.get("proposed_tokens", 0)), int(spec.get("accepted_tokens", 0)),
            int(spec.get("decode_positions", 0)))


def server_cpu(server: servers.Server) -> float:
    return sum(cpu.cpu_seconds(pid) or 0.0 for pid in server.processes().values())


def measure(server: servers.Server, requests: list[clients.Request], concurrency: int, cell: Cell) -> None:
    """Send the requests (at most `concurrency` at once) and add what they did to cell."""
    proposed0, accepted0, positions0 = spec_counts(server)
    cpu0 = server_cpu(server)
    res = clients.load(server.base_url, requests, concurrency)
    cell.cpu_s += server_cpu(server) - cpu0
    proposed1, accepted1, positions1 = spec_counts(server)
    cell.positions += positions1 - positions0
    cell.proposed += proposed1 - proposed0
    cell.accepted += accepted1 - accepted0
    cell.tokens += res.tokens
    cell.errors += res.errors
    if concurrency == 1:
        rates = [s.decode_tps for s in res.ok]
        cell.rates.append(statistics.median(rates) if rates else float("nan"))
    else:
        cell.rates.append(res.aggregate_tps)


def same_greedy_answer(sides: dict[str, servers.Server], request: clients.Request) -> dict[str, bool]:
    """Whether each mode's greedy answer to one request is byte-identical to SPECULATIVE=off's."""
    body = {k: v for k, v in request.body.items() if k not in ("stream", "stream_options")}
    texts = {}
    for mode, s in sides.items():
        choice = httpx.post(s.base_url + request.path, json=body, timeout=600).json()["choices"][0]
        texts[mode] = choice["message"]["content"] if "message" in choice else choice["text"]
    return {mode: texts[mode] == texts["off"] for mode in sides}


def run_ranks(args, ranks: int, modes: dict[str, dict[str, str]], model_name: str, vocab: list[int],
              bias: dict[int, float], work: servers.Workdir) -> dict:
    sides: dict[str, servers.Server] = {}
    cells = {w: {m: Cell() for m in modes} for w in args.workloads}
    ratios: dict[str, dict[str, list[float]]] = {w: {m: [] for m in modes} for w in args.workloads}
    try:
        for mode, settings in modes.items():
            say(f"{ranks} rank(s): starting SPECULATIVE={mode}")
            sides[mode] = servers.start_ours(work, model_name, args.cache_dir, ranks, **settings)
        model_id = httpx.get(sides["off"].base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        identical = {w: same_greedy_answer(sides, clients.completion(copy_prompt(0, args.block, args.reps, vocab),
                                                                     args.max_tokens, bias, model_id)
                                           if w == "copy" else clients.chat(copy_turns.TURNS[w](0), args.max_tokens,
                                                                            bias, model_id))
                     for w in args.workloads if w == "copy" or w in copy_turns.TURNS}
        n = 0
        for i in range(args.rounds):
            workloads = {  # (prompts, concurrency, as token ids), built only for the workloads asked
                "copy": lambda: ([copy_prompt(10 + args.requests * i + j, args.block, args.reps, vocab)
                                  for j in range(args.requests)], 1, True),
                "chat": lambda: ([prompt(500_000 + 100 * ranks + args.requests * i + j)
                                  for j in range(args.requests)], 1, False),
                "copy x8": lambda: ([copy_prompt(100 + args.concurrency * i + k, args.block, args.reps, vocab)
                                     for k in range(args.concurrency)], args.concurrency, True),
                "chat x8": lambda: ([prompt(600_000 + 100 * ranks + args.concurrency * i + k)
                                     for k in range(args.concurrency)], args.concurrency, False),
                **{w: lambda turn=turn: ([turn(1 + args.requests * i + j) for j in range(args.requests)], 1, False)
                   for w, turn in copy_turns.TURNS.items()},
            }
            for w in args.workloads:
                prompts, conc, as_tokens = workloads[w]()
                cpu.wait_quiet(args.quiet_threshold, args.quiet_wait)
                names = list(modes)
                k = n % len(names)  # each round and workload starts with another mode
                n += 1
                for mode in names[k:] + names[:k]:
                    reqs = [clients.completion(p, args.max_tokens, bias, model_id) if as_tokens
                            else clients.chat(p, args.max_tokens, bias, model_id) for p in prompts]
                    measure(sides[mode], reqs, conc, cells[w][mode])
                off = cells[w]["off"].rates[-1]
                for mode in modes:
                    ratios[w][mode].append(cells[w][mode].rates[-1] / off if off else float("nan"))
            say(f"{ranks} rank(s): round {i + 1}/{args.rounds} done")
    finally:
        for s in sides.values():
            s.stop()
    return {"cells": cells, "ratios": ratios, "identical": identical}


def say(msg: str) -> None:
    print(f"[spec {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def fmt(x: float, spec: str = ".2f") -> str:
    return "–" if x != x else format(x, spec)


def report(results: dict[int, dict], modes: list[str], concurrency: int, workloads: list[str]) -> str:
    lines = ["| ranks | workload | SPECULATIVE | tokens / forward | acceptance | tok/s (median) | ratio to off "
             "| positions / token | CPU ms / token | greedy = off |", "|---|---|---|---|---|---|---|---|---|---|"]
    for ranks, r in results.items():
        for w in workloads:
            shown = w.replace("x8", f"x{concurrency}")
            for mode in modes:
                c: Cell = r["cells"][w][mode]
                rate = statistics.median(c.rates) if c.rates else float("nan")
                ratio = statistics.median(r["ratios"][w][mode]) if r["ratios"][w][mode] else float("nan")
                same = "" if w not in r["identical"] else "yes" if r["identical"][w][mode] else "**no**"
                lines.append(f"| {ranks} | {shown} | {mode} | {fmt(c.tokens_per_forward())} | "
                             f"{fmt(c.acceptance(), '.0%') if mode != 'off' else '–'} | {fmt(rate, '.1f')} | "
                             f"{fmt(ratio)} | {fmt(c.positions_per_token())} | {fmt(c.cpu_ms_per_token(), '.1f')} | "
                             f"{same}{' errors: ' + c.errors[0] if c.errors else ''} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-small", help="demo-tiny, demo-small, or a local MLX model folder")
    parser.add_argument("--draft-model", default="demo-tiny",
                        help="DRAFT_MODEL for the draft mode; the model itself when their tokenizers differ")
    parser.add_argument("--modes", default="off,ngram,draft",
                        help="SPECULATIVE modes to compare (off is always in): off, ngram, draft, mtp")
    parser.add_argument("--parallel", default="", help="PARALLEL for every server (mtp on several ranks: tensor)")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--requests", type=int, default=3,
                        help="requests one after another per round for copy and chat (their median rate counts)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--num-draft-tokens", type=int, default=4)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workloads", default="copy,chat,copy x8",
                        help="comma-separated, of: " + ", ".join(WORKLOADS))
    parser.add_argument("--block", type=int, default=8, help="tokens of the copy prompt's repeated block")
    parser.add_argument("--reps", type=int, default=32, help="times the copy prompt repeats its block")
    parser.add_argument("--quiet-wait", type=float, default=2.0)
    parser.add_argument("--quiet-threshold", type=float, default=0.5)
    parser.add_argument("--cache-dir", type=Path, default=servers.REPO / ".cache" / "models")
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    parser.add_argument("--keep-logs", action="store_true")
    args = parser.parse_args()
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    if not args.workloads or set(args.workloads) - set(WORKLOADS):
        parser.error(f"--workloads: comma-separated, of: {', '.join(WORKLOADS)}")
    mode_names = ["off"] + [m for m in args.modes.split(",") if m and m != "off"]
    rank_counts = [int(r) for r in args.ranks.split(",") if r]
    if args.rounds < 1 or args.requests < 1 or args.concurrency < 1 or not rank_counts or min(rank_counts) < 1:
        parser.error("--rounds, --requests, --concurrency and every --ranks must be at least 1")
    model_path, model_name = resolve_model(args.model, args.cache_dir)
    vocab = plain_tokens(model_path) if {"copy", "copy x8"} & set(args.workloads) else []
    bias = {t: -100.0 for t in eos_token_ids(model_path)}
    modes: dict[str, dict[str, str]] = {}
    draft_note = ""
    for mode in mode_names:
        settings = {"SPECULATIVE": mode, "NUM_DRAFT_TOKENS": str(args.num_draft_tokens)}
        if args.parallel:
            settings["PARALLEL"] = args.parallel
        if mode == "draft":
            settings["DRAFT_MODEL"], draft_note = draft_model_for(model_name, model_path, args.draft_model,
                                                                  args.cache_dir)
        modes[mode] = settings
    work = servers.Workdir()
    results: dict[int, dict] = {}
    failed = False
    try:
        for ranks in rank_counts:
            results[ranks] = run_ranks(args, ranks, modes, model_name, vocab, bias, work)
            # a failed request keeps every server's log (an engine that ended mid-run says why there)
            failed = failed or any(c.errors for cs in results[ranks]["cells"].values() for c in cs.values())
    except BaseException:
        failed = True
        raise
    finally:
        work.finish(args.keep_logs or failed)
    print(f"## Speculative decoding: {model_name}, NUM_DRAFT_TOKENS {args.num_draft_tokens}, max_tokens "
          f"{args.max_tokens}, {args.rounds} round(s); copy prompt: {args.block} tokens x {args.reps}\n")
    if draft_note:
        print(f"draft: {draft_note}\n")
    print(report(results, mode_names, args.concurrency, args.workloads))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-speculative-{Path(model_name).name}.json"
    path.write_text(json.dumps({
        "model": model_name, "modes": modes, "args": {k: str(v) for k, v in vars(args).items()},
        "results": {str(r): {"identical": v["identical"], "ratios": v["ratios"],
                             "cells": {w: {m: vars(c) for m, c in cs.items()} for w, cs in v["cells"].items()}}
                    for r, v in results.items()}}, indent=1))
    print(f"\nResults: {servers.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
