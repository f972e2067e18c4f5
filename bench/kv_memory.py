"""KV bytes per sequence: the config formula and the engine's measurement against what the caches really hold.

For every zoo model (one rank, in process): one token's KV from the config (layers x 2 x KV heads x head
size x dtype, the engine's fallback), the engine's measurement at load (bytes per token of the layers that
keep every token, of the sliding-window layers and their window, constant state per sequence), then for a
few sequence lengths the most the model's own caches hold (nbytes) over a prefill in the engine's chunks
and one decoded token, with both estimates as multiples of it. Prints a Markdown table.

    .venv/bin/python -m bench.kv_memory [--lengths 64,300,1000,4000] [--chunk 512] [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import mlx.core as mx
from mlx_lm import load
from mlx_lm.models.cache import make_prompt_cache

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", default=list(ARCH_MODELS))
    parser.add_argument("--lengths", default="64,300,1000,4000")
    parser.add_argument("--chunk", type=int, default=512, help="prefill tokens per step (PREFILL_TOKENS_PER_STEP)")
    args = parser.parse_args()
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
