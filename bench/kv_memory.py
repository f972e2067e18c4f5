"""KV bytes per sequence: the config formula and the engine's measurement against what the caches really hold.

For every zoo model (one rank, in process): one token's KV from the config (layers x 2 x KV heads x head
size x dtype, the engine's fallback), the engine's measurement at load (bytes per token of the layers that
keep every token, of the sliding-window layers and their window, constant state per sequence), then for a
few sequence lengths the most the model's own caches hold (nbytes) over a prefill in the engine's chunks
and one decoded token, with both estimates as multiples of it. Prints a Markdown table.

    .venv/bin/python -m bench.kv_memory [--lengths 64,300,1000,4000] [--chunk 512] [NAME ...]

With --peak (KV precisions, as bench/kv_quality.py's --configs) it measures instead what quantizing the KV cache
saves at MLX's peak, in process with mlx-lm's caches (QuantizedKVCache quantizes each chunk as it lands, as the
engine does): the peak over a --prefill-token prefill in --chunk steps then a few decoded tokens, and over a full
batch (--batch sequences of --batch-tokens each, prefilled together then decoding), each from a reset peak, less
the weights; and the cache's own bytes at the end. One model (--model), one rank.

    .venv/bin/python -m bench.kv_memory --peak off,8/64,4/64 --model smollm2-135m --prefill-tokens 8192
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

from bench.kv_quality import Config, make_cache
from bench.perplexity import model_folder

from engine.facts import scalars
from engine.kv_measure import measure
from engine.rank0.kv_budget import KVBudget, steps, token_bytes
from engine.zoo import ensure_zoo_model
from engine.zoo.names import ARCH_MODELS

CACHE = Path(__file__).resolve().parent.parent / ".cache" / "models"


def real_bytes(model, tokens: int, chunk: int) -> int:
    """The most the model's caches hold (nbytes) over a chunked prefill of tokens - 1 and one decoded token: what
    a reservation must cover (a sliding window holds a whole chunk next to its window while prefilling)."""
    cache = make_prompt_cache(model)
    most = 0
    for start in range(0, tokens - 1, chunk):
        mx.eval(model(mx.array([[1 + (i % 500) for i in range(start, min(tokens - 1, start + chunk))]]), cache=cache))
        most = max(most, sum(c.nbytes for c in cache))
    mx.eval(model(mx.array([[7]]), cache=cache))
    return max(most, sum(c.nbytes for c in cache))


def row(name: str, lengths: list[int], chunk: int) -> str:
    path = ensure_zoo_model(name, CACHE)
    model = load(str(path))[0]
    config = scalars(json.loads((path / "config.json").read_text()))
    old = token_bytes(config, 1, str(config.get("torch_dtype", "")))
    started = time.perf_counter()
    memory = measure(model)
    took = time.perf_counter() - started
    new = KVBudget.of(1, memory, chunk)
    cells = []
    for n in lengths:
        real = real_bytes(model, n, chunk)
        cells.append(f"{real / 1024:.0f} KiB: {new.sequence(n, 0) / real:.2f}x / {old * steps(n) / real:.2f}x")
    parts = f"{memory.token_bytes} + {memory.window_token_bytes}@{memory.window} + {memory.constant_bytes}"
    return f"| {name} | {old} | {parts} | {took * 1000:.0f} ms | " + " | ".join(cells) + " |"


def last_logits(model, x, cache):
    """The last position's logits only (a server samples nothing else): a whole chunk's logits would dwarf the KV
    in the peak (512 x 49152 floats for SmolLM2). The model's own call where it has no inner `model`."""
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "embed_tokens"):
        return model(x, cache=cache)[:, -1]
    h = inner(x, cache=cache)[:, -1:]
    head = model.lm_head if hasattr(model, "lm_head") else inner.embed_tokens.as_linear
    return head(h)[:, -1]


def _run(model, cache, rows: int, tokens: int, chunk: int, decode: int = 4) -> None:
    """Prefill rows x tokens (chunk positions of every row a step), then decode a few tokens."""
    for start in range(0, tokens, chunk):
        n = min(chunk, tokens - start)
        x = mx.array([[1 + (r * 7 + i) % 1000 for i in range(start, start + n)] for r in range(rows)])
        mx.eval(last_logits(model, x, cache))
    for i in range(decode):
        mx.eval(last_logits(model, mx.full((rows, 1), 5 + i), cache))


def peak_row(model, config: Config, rows: int, tokens: int, chunk: int) -> tuple[int, int]:
    """MLX's peak during the run less what was active before it, and the cache's bytes after it."""
    gc.collect()
    mx.clear_cache()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    cache = make_cache(model, config)
    started = time.perf_counter()
    _run(model, cache, rows, tokens, chunk)
    peak = mx.get_peak_memory() - before
    held = sum(c.nbytes for c in cache)
    print(f"  {config}: {rows}x{tokens} in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    return peak, held


def peak_table(args) -> None:
    model = load(str(model_folder(args.model, args.cache_dir)))[0]
    mx.eval(model.parameters())
    weights = mx.get_active_memory()
    configs = [Config.parse(c) for c in args.peak.split(",")]
    runs = [(1, args.prefill_tokens, args.chunk), (args.batch, args.batch_tokens, max(1, args.chunk // args.batch))]
    print(f"{args.model}, 1 rank, in process (mlx-lm's QuantizedKVCache), weights {weights / 2**20:.1f} MiB active; "
          f"memory in MiB; the full batch prefills {runs[1][2]} positions of every sequence a step")
    print()
    print("| KV | run | peak above weights | vs float | KV cache held | vs float | bytes / token |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for rows, tokens, chunk in runs:
        base = None
        for config in configs:
            peak, held = peak_row(model, config, rows, tokens, chunk)
            base = base or (peak, held)
            print(f"| {config} | {rows} x {tokens} tokens | {peak / 2**20:.1f} | {peak / base[0]:.2f}x | "
                  f"{held / 2**20:.1f} | {held / base[1]:.2f}x | {held / (rows * (tokens + 4)):.0f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(ARCH_MODELS))
    parser.add_argument("--lengths", default="64,300,1000,4000")
    parser.add_argument("--chunk", type=int, default=512, help="prefill tokens per step (PREFILL_TOKENS_PER_STEP)")
    parser.add_argument("--peak", default="", help="KV precisions (off,8/64,4/64): measure peak memory instead")
    parser.add_argument("--model", default="smollm2-135m", help="--peak: MODEL (a demo or zoo name, a path)")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "mlx-cluster-serve")
    parser.add_argument("--prefill-tokens", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--batch-tokens", type=int, default=1024)
    args = parser.parse_args()
    if args.peak:
        peak_table(args)
        return
    lengths = [int(n) for n in args.lengths.split(",")]
    print(f"KV per sequence on 1 rank, prefill chunk {args.chunk}. Measured: bytes per token + bytes per token"
          "@window + constant bytes. Cells: real nbytes at their most, then measured estimate / config estimate as multiples of it.")
    print()
    print("| model | config B/token | measured | measure time | " + " | ".join(f"{n} tokens" for n in lengths) + " |")
    print("|---|---:|---|---:|" + "---|" * len(lengths))
    for name in args.names:
        print(row(name.removeprefix("zoo-"), lengths, args.chunk), flush=True)


if __name__ == "__main__":
    main()
