"""KV bytes per token per rank at KV_BITS off, 8 and 4, as the engine measures them at load (engine/kv_measure.py).

One rank in process, each model with KV_BITS's caches installed as at load (engine/kvquant): SmolLM2-135M (the
default model, heads of 64), demo-tiny and a zoo model as shipped (heads of 16, which no group size divides: they
are refused, and the note under the table says why), and the zoo's layer patterns with heads of 64
(engine/zoo/wide.py): plain KV, linear attention beside full attention, sliding windows (gpt-oss's, with
attention sinks, refused), MLA's latent.
With --ranks N, SmolLM2 also on N ranks over the ring, started as the engine (tests/harness.py), the largest rank's
bytes as its Info reports them. Cells: bytes per token [+ per token of a window] [+ constant state per sequence],
then the multiple of the float cell. Prints a Markdown table.

    .venv/bin/python -m bench.kv_bytes [--group 64] [--ranks 2]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from engine.kv_measure import measure_kv
from engine.kvquant.kinds import KVQuantRefused, install
from engine.rank0.kv_budget import KVMemory
from engine.rank0.kv_precision import dtype_name
from tests.harness import MODEL_CACHE

BITS = (None, 8, 4)
# why a model is refused, printed under the table once per reason (the first model it was seen on)
NOTES: dict[str, str] = {}
WIDE = {"llama": "KVCache", "qwen3-next": "ArraysCache + KVCache", "gpt-oss": "RotatingKVCache + KVCache (sinks)",
        "ministral3": "RotatingKVCache + KVCache",
        "deepseek-v3": "KVCache of MLA's latent"}


def cell(memory: KVMemory, full: KVMemory | None) -> str:
    text = f"{memory.token_bytes}"
    if memory.window_token_bytes:
        text += f" + {memory.window_token_bytes}@{memory.window}"
    if memory.constant_bytes:
        text += f" + {memory.constant_bytes}"
    if full is not None:
        text += f" ({(memory.token_bytes + memory.window_token_bytes) / (full.token_bytes + full.window_token_bytes):.2f}x)"
    return text


def in_process(name: str, caches: str, build: Callable[[], Any], group: int) -> str:
    full, dtype = measure_kv(build())
    cells = [f"{cell(full, None)} ({dtype_name(dtype)})"]
    for bits in BITS[1:]:
        model = build()  # install() wraps the model's make_cache: a fresh model per setting
        try:
            install(model, bits, group)
        except KVQuantRefused as exc:
            cells.append("refused")
            NOTES.setdefault(str(exc), name)
            continue
        cells.append(cell(measure_kv(model)[0], full))
    return f"| {name} | {caches} | 1 | " + " | ".join(cells) + " |"


def started(model: str, ranks: int, group: int) -> str:
    from tests.harness import Stack

    cells, full = [], None
    for bits in BITS:
        # a loaded machine's first prefill passes outlive the default watchdog; only the measurement matters here
        stack = Stack(extra={"MODEL": model, "KV_BITS": str(bits or "off"), "KV_GROUP_SIZE": str(group),
                             "WATCHDOG_TIMEOUT": "600"})
        engine = stack.start_engine(ranks=ranks, timeout=600)
        try:
            info = stack.probe()
        finally:
            engine.stop()
        memory = KVMemory(info["kv_token_bytes"], info["kv_window_token_bytes"], info["kv_window"],
                          info["kv_constant_bytes"])
        cells.append(cell(memory, full) + ("" if full else f" ({info['kv_precision']})"))
        full = full or memory
    return f"| {model} | KVCache ({info['parallel']}) | {ranks} | " + " | ".join(cells) + " |"


def bf16(model: Any) -> Any:
    """The model computing in bfloat16, as most checkpoints on a Mac do (MLX's CPU build computes these in float32)."""
    import mlx.core as mx

    model.set_dtype(mx.bfloat16)
    return model


def main() -> None:
    from mlx_lm.utils import load_model

    from engine.demo import ensure_demo_model
    from engine.gguf import ensure_packaged_model
    from engine.zoo import ensure_zoo_model
    from engine.zoo.wide import wide_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", type=int, default=64, help="KV_GROUP_SIZE")
    parser.add_argument("--ranks", type=int, default=0, help="also SmolLM2 started on this many ranks")
    args = parser.parse_args()
    print(f"KV bytes per token per rank, KV_GROUP_SIZE={args.group}.")
    print()
    print("| model | caches | ranks | KV_BITS=off | 8 | 4 |")
    print("|---|---|---:|---|---|---|")
    smollm2 = ensure_packaged_model("135m", MODEL_CACHE)
    rows = [("smollm2-135m", "KVCache", lambda: load_model(smollm2)[0]),
            ("smollm2-135m, cast to bf16", "KVCache", lambda: bf16(load_model(smollm2)[0])),
            ("demo-tiny", "KVCache", lambda: load_model(ensure_demo_model("tiny", MODEL_CACHE))[0]),
            ("zoo-qwen3-next", "ArraysCache + KVCache", lambda: load_model(ensure_zoo_model("qwen3-next", MODEL_CACHE))[0])]
    rows += [(f"zoo {family}, heads of 64", caches, lambda f=family: wide_model(f)) for family, caches in WIDE.items()]
    rows += [("zoo qwen3.5, heads of 64, bf16", WIDE["qwen3-next"], lambda: bf16(wide_model("qwen3.5")))]  # dense: MLX's CPU experts take float32 only
    for name, caches, build in rows:
        print(in_process(name, caches, build, args.group), flush=True)
    if args.ranks > 1:
        print(started("smollm2-135m", args.ranks, args.group), flush=True)
    for why, name in NOTES.items():
        print(f"\n{name}: {why}")


if __name__ == "__main__":
    main()
