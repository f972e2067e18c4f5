"""`python -m bench.interleaved`: one request at a time, taking turns, so every ratio is paired.

bench/run.py measures each server in its own part, minutes apart; on a shared machine whose speed
drifts by 20-40 % over minutes, that noise lands in the ratios. Here everything runs at once and
takes turns, round after round, with the same prompt in each round:

- in-process `mlx_lm.stream_generate` (this process holds the model; the single-stream ceiling),
- our server through HTTP (the API and one engine rank),
- our engine through its Unix socket, without the API (what the HTTP layer costs, by difference; with a
  prompt of its own, which our prefix cache would otherwise serve whole after the HTTP request),
- `mlx_lm.server` through HTTP.

Two kinds of rounds: decode (max_tokens 128, EOS suppressed; decode tok/s between the first and last
token) and first token (max_tokens 4; ms to the first token with text). Each ratio is the median of
the per-round ratios. Prompts are bench/run.py's: short, distinct, one after the other, so a prompt
cache can only reuse the chat template's first tokens, as with real traffic.

With --concurrency (say 8,32), each round also sends c requests at once to each side in turn: c prompts
inserted at once into an in-process mlx-lm BatchGenerator (the batch ceiling), c concurrent streams to
ours through HTTP, c to our engine's socket, c to mlx_lm.server; aggregate tok/s is every token over the
time from the first request to the last token, on every side.

Each round starts with a different side (round i with the i-th, in turn), so none is always the one that
runs right after the wait for a quiet machine, or right after the heaviest one.

    python -m bench.interleaved --model demo-small --rounds 8
    python -m bench.interleaved --model demo-small --rounds 4 --concurrency 8,32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import httpx  # noqa: E402

from bench import ceilings, clients, cpu, servers  # noqa: E402
from bench.ceilings import chat_tokens  # noqa: E402
from bench.run import eos_token_ids, prompt, resolve_model  # noqa: E402

T = TypeVar("T")

# 32 concurrent prefills of a real model take minutes on a busy 2-core CPU: the clients' and our server's
# default 600 s would end the round (`REQUEST_TIMEOUT` of ours is raised to match).
REQUEST_TIMEOUT = 3600.0

SIDES = ["stream_generate", "ours (HTTP)", "ours (engine socket)", "mlx_lm.server"]
BATCH_SIDES = ["BatchGenerator", "ours (HTTP)", "ours (engine socket)", "mlx_lm.server"]


def in_turn(i: int, calls: dict[str, Callable[[], T]]) -> dict[str, T]:
    """Run every call once, starting with the (i mod n)-th and going round; results in the calls' order."""
    names = list(calls)
    k = i % len(names)
    done = {}
    for name in names[k:] + names[:k]:
        t0 = time.perf_counter()
        done[name] = calls[name]()
        # a round of a real model on a busy CPU takes many minutes: say where it is
        print(f"  {name}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return {name: done[name] for name in names}


def paired(rounds: list[dict[str, float]], num: str, den: str) -> float:
    """The median over rounds of num/den, from rounds where both were measured."""
    ratios = [r[num] / r[den] for r in rounds if r.get(num) and r.get(den)]
    return statistics.median(ratios) if ratios else float("nan")


def table(kind: str, unit: str, rounds: list[dict[str, float]], scale: float = 1.0,
          sides: list[str] = SIDES) -> str:
    lines = [f"| {kind} | best | median | per round |", "|---|---|---|---|"]
    for side in sides:
        vals = [r[side] * scale for r in rounds if r.get(side)]
        if not vals:
            continue
        best = min(vals) if unit == "ms" else max(vals)
        lines.append(f"| {side} | {best:.1f} {unit} | {statistics.median(vals):.1f} {unit} | "
                     + ", ".join(f"{v:.1f}" for v in vals) + " |")
    return "\n".join(lines)


class Sides:
    """Everything measured, loaded and started once; each method times one request."""

    def __init__(self, model_path: Path, model_name: str, cache_dir: Path, work: servers.Workdir):
        from mlx_lm import load

        self.model, self.tokenizer = load(str(model_path))
        self.bias = {t: -100.0 for t in eos_token_ids(model_path)}
        self.ours = servers.start_ours(work, model_name, cache_dir, 1, REQUEST_TIMEOUT=str(REQUEST_TIMEOUT))
        try:
            self.mlx_lm = servers.start_mlx_lm(work, model_path, 1)
        except BaseException:
            self.ours.stop()
            raise
        self.socket = str(work.root / f"{self.ours.base_url.rsplit(':', 1)[1]}.sock")
        try:
            self.model_id = httpx.get(self.ours.base_url + "/v1/models", timeout=10).json()["data"][0]["id"]
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.ours.stop()
        self.mlx_lm.stop()

    def in_process(self, content: str, n: int) -> tuple[float, float]:
        """(first-token seconds, decode tok/s) of mlx_lm.stream_generate."""
        from mlx_lm import stream_generate
        from mlx_lm.sample_utils import make_logits_processors

        t0, times = time.perf_counter(), []
        for _ in stream_generate(self.model, self.tokenizer, chat_tokens(self.tokenizer, content), max_tokens=n,
                                 logits_processors=make_logits_processors(logit_bias=self.bias)):
            times.append(time.perf_counter())
        return times[0] - t0, _rate(len(times), times)

    def in_process_batch(self, contents: list[str], n: int) -> float:
        """Aggregate tok/s of an mlx-lm BatchGenerator with every prompt inserted at once."""
        return ceilings.batch_once(self.model, self.tokenizer, contents, n, self.bias, list(self.bias))["aggregate_tps"]

    def batch_over_http(self, base_url: str, contents: list[str], n: int, model: str | None) -> float:
        """Aggregate tok/s of len(contents) concurrent streamed chat requests."""
        result = clients.load(base_url, [clients.chat(c, n, self.bias, model) for c in contents], len(contents),
                              REQUEST_TIMEOUT)
        if result.errors or result.tokens < n * len(contents):
            raise RuntimeError(f"{base_url}: {result.errors[:1] or f'{result.tokens} of {n * len(contents)} tokens'}")
        return result.aggregate_tps

    def over_http(self, base_url: str, content: str, n: int, model: str | None) -> tuple[float, float]:
        """(first-token seconds, decode tok/s) of one streamed chat request, timed as bench.run times it."""
        result = clients.load(base_url, [clients.chat(content, n, self.bias, model)], 1, REQUEST_TIMEOUT)
        s = result.samples[0]
        if not s.ok or s.tokens < n:
            raise RuntimeError(f"{base_url}: {s.error or f'{s.tokens} of {n} tokens'}")
        return s.ttft, s.decode_tps

    async def _socket_stream(self, content: str, n: int) -> tuple[float, list[tuple[float, int]]]:
        """One request on the API's own protocol over the Unix socket: (time sent, (time, completion tokens)
        of every Delta with text and of the Finish)."""
        from ipc import Delta, Error, Finish, Generate, SamplingParams
        from ipc.connection import connect

        t0 = time.perf_counter()
        conn = await connect(self.socket, client="bench")
        marks: list[tuple[float, int]] = []
        try:
            await conn.send(Generate(request_id=f"bench-{uuid.uuid4().hex[:16]}", kind="chat",
                                     params=SamplingParams(max_tokens=n, temperature=0.0, logit_bias=self.bias),
                                     messages=[{"role": "user", "content": content}]))
            while True:
                msg = await conn.recv()
                if isinstance(msg, Error):
                    raise RuntimeError(f"engine: {msg.message}")
                if isinstance(msg, Delta | Finish) and (msg.text or isinstance(msg, Finish)):
                    marks.append((time.perf_counter(), msg.completion_tokens))
                if isinstance(msg, Finish):
                    break
        finally:
            await conn.aclose()
        return t0, marks

    def over_socket(self, content: str, n: int) -> tuple[float, float]:
        """Our engine alone: (first-token seconds, decode tok/s) of one request on its Unix socket."""
        t0, marks = anyio.run(self._socket_stream, content, n)
        (first, k0), (last, k1) = marks[0], marks[-1]
        return first - t0, (k1 - k0) / (last - first) if last > first else float("nan")

    def batch_over_socket(self, contents: list[str], n: int) -> float:
        """Our engine alone: aggregate tok/s of len(contents) requests sent at once on connections of their own."""
        async def go() -> list[tuple[float, list[tuple[float, int]]]]:
            results: list = [None] * len(contents)

            async def one(k: int) -> None:
                results[k] = await self._socket_stream(contents[k], n)

            async with anyio.create_task_group() as tg:
                for k in range(len(contents)):
                    tg.start_soon(one, k)
            return results

        results = anyio.run(go)
        tokens = sum(marks[-1][1] for _, marks in results)
        if tokens < n * len(contents):
            raise RuntimeError(f"engine socket: {tokens} of {n * len(contents)} tokens")
        return tokens / (max(marks[-1][0] for _, marks in results) - min(t0 for t0, _ in results))


def _rate(tokens: int, times: list[float]) -> float:
    """Decode tok/s: the tokens after the first over the time from the first to the last one with text."""
    return (tokens - 1) / (times[-1] - times[0]) if len(times) > 1 and times[-1] > times[0] else float("nan")


def measure(sides: Sides, rounds: int, max_tokens: int, quiet: float, concurrency: list[int] = ()) -> dict:
    def one(i: int, n: int, turn: int) -> dict[str, tuple[float, float]]:
        # Our engine's socket gets a prompt of its own: after the HTTP request, the same one would come
        # whole from our prefix cache.
        content = prompt(i)
        cpu.wait_quiet(0.25, quiet)
        return in_turn(turn, {
            "stream_generate": lambda: sides.in_process(content, n),
            "ours (HTTP)": lambda: sides.over_http(sides.ours.base_url, content, n, sides.model_id),
            "ours (engine socket)": lambda: sides.over_socket(prompt(i + 50_000), n),
            "mlx_lm.server": lambda: sides.over_http(sides.mlx_lm.base_url, content, n, None)})

    def batch(i: int, c: int) -> dict[str, float]:
        contents = [prompt(100_000 + 1000 * i + k) for k in range(c)]
        # the socket side gets prompts of its own (the prefix cache would serve the HTTP side's whole)
        own = [prompt(500_000 + 1000 * i + k) for k in range(c)]
        cpu.wait_quiet(0.25, quiet)
        return in_turn(i, {
            "BatchGenerator": lambda: sides.in_process_batch(contents, max_tokens),
            "ours (HTTP)": lambda: sides.batch_over_http(sides.ours.base_url, contents, max_tokens, sides.model_id),
            "ours (engine socket)": lambda: sides.batch_over_socket(own, max_tokens),
            "mlx_lm.server": lambda: sides.batch_over_http(sides.mlx_lm.base_url, contents, max_tokens, None)})

    one(10_000, 8, 0)  # warm every side up
    decode, first = [], []
    batches: dict[str, list[dict[str, float]]] = {str(c): [] for c in concurrency}
    for i in range(rounds):
        d = one(2 * i, max_tokens, i)
        decode.append({k: v[1] for k, v in d.items()})
        f = one(2 * i + 1, 4, i)
        first.append({k: v[0] for k, v in f.items()})
        line = (f"round {i + 1}/{rounds}: decode tok/s " + ", ".join(f"{k} {v:.1f}" for k, v in decode[-1].items())
                + "; first token ms " + ", ".join(f"{k} {1000 * v:.0f}" for k, v in first[-1].items()))
        for c in concurrency:
            batches[str(c)].append(batch(i, c))
            line += f"; c={c} tok/s " + ", ".join(f"{k} {v:.1f}" for k, v in batches[str(c)][-1].items())
        print(line, file=sys.stderr, flush=True)
    return {"decode": decode, "first_token": first, "concurrent": batches}


def report(res: dict) -> str:
    d, f = res["decode"], res["first_token"]
    out = [table("decode, one stream", "tok/s", d), "", table("first token", "ms", f, 1000.0), ""]
    for c, rounds in res.get("concurrent", {}).items():
        out += [table(f"aggregate, {c} streams at once", "tok/s", rounds, sides=BATCH_SIDES), ""]
    out += ["| paired ratio (median over rounds) | value |", "|---|---|"]
    for label, rounds, num, den in [
        ("decode: ours (HTTP) / stream_generate", d, "ours (HTTP)", "stream_generate"),
        ("decode: ours (engine socket) / stream_generate", d, "ours (engine socket)", "stream_generate"),
        ("decode: ours (HTTP) / mlx_lm.server", d, "ours (HTTP)", "mlx_lm.server"),
        ("first token: ours (HTTP) / mlx_lm.server", f, "ours (HTTP)", "mlx_lm.server"),
        ("first token: ours (HTTP) / stream_generate", f, "ours (HTTP)", "stream_generate"),
    ]:
        out.append(f"| {label} | {paired(rounds, num, den):.3f} |")
    for c, rounds in res.get("concurrent", {}).items():
        out.append(f"| c={c}: ours (HTTP) / in-process BatchGenerator({c}) | "
                   f"{paired(rounds, 'ours (HTTP)', 'BatchGenerator'):.3f} |")
        out.append(f"| c={c}: ours (engine socket) / in-process BatchGenerator({c}) | "
                   f"{paired(rounds, 'ours (engine socket)', 'BatchGenerator'):.3f} |")
        out.append(f"| c={c}: ours (HTTP) / mlx_lm.server | {paired(rounds, 'ours (HTTP)', 'mlx_lm.server'):.3f} |")
    return "\n".join(out)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-small", help="demo-tiny, demo-small, or a local MLX model folder")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="",
                        help="comma-separated stream counts (say 8,32) for concurrent rounds too; none by default")
    parser.add_argument("--quiet-wait", type=float, default=20.0,
                        help="before each round wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--cache-dir", type=Path, default=servers.REPO / ".cache" / "models")
    parser.add_argument("--out", type=Path, default=servers.REPO / "bench" / "results")
    args = parser.parse_args()
    try:
        concurrency = [int(c) for c in args.concurrency.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--concurrency must be comma-separated integers, got {args.concurrency!r}")
    if any(c < 1 for c in concurrency):
        parser.error("--concurrency values must be at least 1")
    model_path, model_name = resolve_model(args.model, args.cache_dir)
    work = servers.Workdir()
    sides = None
    try:
        sides = Sides(model_path, model_name, args.cache_dir, work)
        res = measure(sides, args.rounds, args.max_tokens, args.quiet_wait, concurrency)
    finally:
        if sides is not None:
            sides.stop()
        work.finish(False)
    text = report(res)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{time.strftime('%Y%m%d-%H%M%S')}-interleaved-{args.model.replace('/', '_')}.json"
    path.write_text(json.dumps({"model": args.model, "rounds": args.rounds, "max_tokens": args.max_tokens, **res},
                               indent=1))
    print(f"\nResults: {servers.shown(path)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
