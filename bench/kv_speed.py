"""Speed of a quantized KV cache against float, side by side: prefill and decode rates at a ~1k-token and a longer
context, one stream and c streams, the precisions taking turns round after round; and the bytes a decoded token
reads (weights shared by the batch, plus each sequence's KV), which is what a memory-bound Mac turns into speed.

    .venv/bin/python -m bench.kv_speed --model smollm2-135m --contexts 1024,2048 --concurrency 1,8    # mlx-lm
    .venv/bin/python -m bench.kv_speed --model smollm2-135m --way api --contexts 1024,8192 --concurrency 1,8

`--way inprocess`: mlx-lm in this process, c prompts as one batch (c rows of one tensor, each config's own caches:
`QuantizedKVCache` in every layer), prefilled --chunk positions of each row a step, then --max-tokens greedy
steps. `--way api`: one engine and API per config (`KV_BITS`, `KV_GROUP_SIZE`), all started first; c streamed
/v1/completions of token ids at once (EOS suppressed); prefill rate = prompt tokens / the last first token,
decode = the sum of each stream's rate between its first and last token. Prompts are slices of held text at
offsets of their own (no prefix cache can serve one from another). Each round starts with another config.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.kv_quality import Config  # noqa: E402

def kv_token_bytes(layers: int, kv_heads: int, head_dim: int, dtype_bytes: int, config: Config) -> float:
    """Bytes one token's keys and values take in every layer, at this precision: mlx's quantize keeps a group's
    scale and bias in the keys' own dtype, which is float32 for SmolLM2 (its float32 norms promote activations)."""
    values = layers * 2 * kv_heads * head_dim
    if config.bits is None:
        return values * dtype_bytes
    return values * (config.bits / 8 + 2 * dtype_bytes / config.group)


def kv_dtype_bytes(model) -> int:
    """Bytes of one stored key as the model really computes it (not the config's torch_dtype)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([[1]]), cache=cache))
    return next(c.keys.dtype.size for c in cache if getattr(c, "keys", None) is not None)


def read_per_token(weights: int, kv_per_token: float, context: int, streams: int) -> float:
    """Bytes one decode step reads per token it emits: the weights once for the batch, every sequence's KV."""
    return weights / streams + kv_per_token * context


# ---- in-process ----

def prompt_ids(tokens: list[int], length: int, index: int) -> list[int]:
    """The index-th prompt: length tokens of the text from an offset of its own (wrapping round)."""
    start = (index * 997) % max(1, len(tokens) - length) if len(tokens) > length else 0
    ids = (tokens[start:] + tokens) * (length // max(1, len(tokens)) + 2)
    return ids[:length]


def inprocess_once(model, config: Config, prompts: list[list[int]], chunk: int, n: int) -> tuple[float, float]:
    """(prefill tok/s, decode tok/s) of the prompts as one batch."""
    import mlx.core as mx

    from bench.kv_quality import make_cache

    cache = make_cache(model, config)
    x = mx.array(prompts)
    t0 = time.perf_counter()
    for s in range(0, x.shape[1], chunk):
        logits = model(x[:, s:s + chunk], cache=cache)[:, -1]
        mx.eval(logits)
    t1 = time.perf_counter()
    token = mx.argmax(logits, axis=-1)[:, None]
    mx.eval(token)
    t2 = time.perf_counter()
    for _ in range(n):
        token = mx.argmax(model(token, cache=cache)[:, -1], axis=-1)[:, None]
        mx.eval(token)
    t3 = time.perf_counter()
    return x.size / (t1 - t0), n * x.shape[0] / (t3 - t2)


# ---- through the API ----

def api_once(base_url: str, prompts: list[list[int]], n: int, bias: dict[int, float]) -> tuple[float, float]:
    from bench import clients

    result = clients.load(base_url, [clients.completion(p, n, bias, "default") for p in prompts], len(prompts),
                          timeout=3600)
    if result.errors or result.tokens < n * len(prompts):
        raise RuntimeError(f"{base_url}: {result.errors[:1] or f'{result.tokens} of {n * len(prompts)} tokens'}")
    first = max(s.first for s in result.samples) - min(s.sent for s in result.samples)
    return sum(map(len, prompts)) / first, sum(s.decode_tps for s in result.samples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "mlx-cluster-serve")
    ap.add_argument("--way", default="inprocess", choices=("inprocess", "api"))
    ap.add_argument("--configs", default="off,8/64,4/64")
    ap.add_argument("--contexts", default="1024,2048", help="prompt lengths in tokens")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=512, help="prefill positions of each prompt a step (in-process)")
    ap.add_argument("--text", type=Path, default=REPO / "docs" / "cluster.md")
    args = ap.parse_args(argv)

    import json

    from mlx_lm.utils import load_tokenizer

    from bench.interleaved import in_turn
    from bench.perplexity import model_folder
    from bench.run import eos_token_ids

    configs = [Config.parse(c) for c in args.configs.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    concurrency = [int(c) for c in args.concurrency.split(",")]
    folder = model_folder(args.model, args.cache_dir)
    text_ids = load_tokenizer(folder).encode(args.text.read_text())
    config_json = json.loads((folder / "config.json").read_text())
    weights = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    shape = (config_json["num_hidden_layers"], config_json["num_key_value_heads"],
             config_json.get("head_dim") or config_json["hidden_size"] // config_json["num_attention_heads"])
    from mlx_lm import load

    model = load(str(folder))[0]
    dtype_bytes = kv_dtype_bytes(model)
    servers_up = []
    if args.way == "inprocess":
        run = {str(c): (lambda c: lambda prompts: inprocess_once(model, c, prompts, args.chunk, args.max_tokens))(c)
               for c in configs}
    else:
        from bench import servers

        work = servers.Workdir()
        bias = {t: -100.0 for t in eos_token_ids(folder)}
        for c in configs:
            servers_up.append(servers.start_ours(work, args.model, args.cache_dir, 1, timeout=900,
                                                 PROMPT_CACHE_BYTES="0", WATCHDOG_TIMEOUT="1800",
                                                 REQUEST_TIMEOUT="3600", **c.env()))
        run = {str(c): (lambda url: lambda prompts: api_once(url, prompts, args.max_tokens, bias))(s.base_url)
               for c, s in zip(configs, servers_up)}
    results: dict[tuple[int, int], list[dict[str, tuple[float, float]]]] = {}
    index = 0
    try:
        for r in range(args.rounds):
            for ctx in contexts:
                for c in concurrency:
                    prompts = {}
                    for name in run:
                        prompts[name] = [prompt_ids(text_ids, ctx, index + k) for k in range(c)]
                        index += c
                    got = in_turn(r, {name: (lambda f, p: lambda: f(p))(run[name], prompts[name]) for name in run})
                    results.setdefault((ctx, c), []).append(got)
                    print(f"round {r + 1}: {ctx} tokens x {c}: " + ", ".join(
                        f"{k} prefill {v[0]:.1f} decode {v[1]:.1f}" for k, v in got.items()), file=sys.stderr,
                        flush=True)
    finally:
        for s in servers_up:
            s.stop()

    if results:
        print(f"{args.model}, {args.way}, {args.rounds} rounds, {args.max_tokens} decoded tokens a stream; "
              "tok/s best (median); ratio: paired median over rounds against float\n")
        print("| context | streams | KV | prefill tok/s | vs float | decode tok/s | vs float |")
        print("|---:|---:|---|---:|---:|---:|---:|")
        base = str(configs[0])
        for (ctx, c), rounds in results.items():
            for name in map(str, configs):
                cells = []
                for i in (0, 1):
                    vals = [rd[name][i] for rd in rounds]
                    ratio = statistics.median(rd[name][i] / rd[base][i] for rd in rounds)
                    cells.append(f"{max(vals):.1f} ({statistics.median(vals):.1f}) | {ratio:.2f}x")
                print(f"| {ctx} | {c} | {name} | {cells[0]} | {cells[1]} |")
        print()
    print(f"{args.model}: bytes one decode step reads per token it emits (weights {weights / 2**20:.1f} MiB once a "
          f"step for every stream, plus each stream's KV; KV per token " + ", ".join(
              f"{c} {kv_token_bytes(*shape, dtype_bytes, c):.0f} B" for c in configs) + ")\n")
    print("| context | streams | " + " | ".join(map(str, configs)) + " |")
    print("|---:|---:|" + "---:|" * len(configs))
    for ctx in contexts:
        for c in concurrency:
            reads = [read_per_token(weights, kv_token_bytes(*shape, dtype_bytes, k), ctx, c) for k in configs]
            print(f"| {ctx} | {c} | " + " | ".join(f"{r / 2**20:.2f} MiB ({r / reads[0]:.2f}x)" for r in reads) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
