"""Perplexity of a text through the API (prompt logprobs: /v1/completions with echo, logprobs, max_tokens 0) and
in-process with mlx-lm, side by side: the measuring stick for every change that trades quality for memory or speed.

    .venv/bin/python -m bench.perplexity                                  # demo-tiny, 1 rank, README.md's text
    .venv/bin/python -m bench.perplexity --model smollm2-135m --ranks 2 --parallel pipeline --tokens 4000
    .venv/bin/python -m bench.perplexity --base-url http://127.0.0.1:8000 --model smollm2-135m  # a running server

Starts its own engine and API on free ports (unless --base-url names a running one, which must serve --model),
scores the text's first --tokens tokens both ways and prints one row per way: tokens, perplexity, the largest
per-token difference. Exit 0 when the perplexities agree within --tolerance (relative), 1 otherwise.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# positions per in-process forward pass: bounds its logits to CHUNK x vocabulary
CHUNK = 512


def model_folder(model: str, cache_dir: Path) -> Path:
    """The folder MODEL names, as the engine resolves it (a demo or zoo name, a path, a cached repo id)."""
    from config import load_settings
    from engine.model import resolve

    env = {"MODEL": model, "MODEL_CACHE_DIR": str(cache_dir)}
    return resolve(load_settings(env, env_file=os.devnull))


def api_logprobs(client, text: str, model: str = "default") -> tuple[list[str], list[float | None]]:
    """The prompt's tokens and their logprobs as the served model scores them (the first one is None)."""
    r = client.completions.create(model=model, prompt=text, echo=True, logprobs=1, max_tokens=0)
    lp = r.choices[0].logprobs
    return lp.tokens, lp.token_logprobs


def inprocess_logprobs(folder: Path, text: str) -> list[float | None]:
    """The same with mlx-lm in this process: its load, its tokenizer, its forward pass in chunks over a KV cache."""
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.models.cache import make_prompt_cache

    model, tokenizer = load(str(folder))
    tokens = tokenizer.encode(text)
    cache = make_prompt_cache(model)
    out: list[float | None] = [None]
    for s in range(0, len(tokens) - 1, CHUNK):
        chunk = tokens[s:s + CHUNK + 1]
        logits = model(mx.array(chunk[:-1])[None], cache=cache)[0].astype(mx.float32)
        rows = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        out += mx.take_along_axis(rows, mx.array(chunk[1:])[:, None], axis=-1)[:, 0].tolist()
    return out


def perplexity(logprobs: list[float | None]) -> float:
    scored = [v for v in logprobs if v is not None]
    return math.exp(-sum(scored) / len(scored))


def text_of(tokens: int, path: Path) -> str:
    """About `tokens` tokens of the file's text (four characters a token is plenty for English)."""
    return path.read_text()[: tokens * 4]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo-tiny", help="MODEL: a demo or zoo name, a path, a cached repo id")
    ap.add_argument("--ranks", type=int, default=1)
    ap.add_argument("--parallel", default="tensor", choices=("tensor", "pipeline"))
    ap.add_argument("--text", type=Path, default=REPO / "README.md", help="the file whose text is scored")
    ap.add_argument("--tokens", type=int, default=2000, help="about how many tokens of it")
    ap.add_argument("--base-url", default="", help="a running server serving --model (none: start one)")
    ap.add_argument("--tolerance", type=float, default=1e-3)
    args = ap.parse_args(argv)

    import openai

    from tests.harness import MODEL_CACHE, Stack

    text = text_of(args.tokens, args.text)
    folder = model_folder(args.model, MODEL_CACHE)
    procs = []
    base_url = args.base_url
    if not base_url:
        stack = Stack(extra={"MODEL": args.model, "PARALLEL": args.parallel})
        procs = [stack.start_engine(ranks=args.ranks, timeout=600), stack.start_api()]
        base_url = stack.base_url
    try:
        with openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key=os.environ.get("API_KEY", "unused"),
                           max_retries=0, timeout=600) as client:
            tokens, served = api_logprobs(client, text)
    finally:
        for p in reversed(procs):
            p.stop()
    local = inprocess_logprobs(folder, text)
    if len(local) != len(served):
        print(f"the API scored {len(served)} tokens, mlx-lm {len(local)}: the tokenizations differ")
        return 1
    worst = max(abs(a - b) for a, b in zip(served[1:], local[1:]))
    api_ppl, local_ppl = perplexity(served), perplexity(local)
    print(f"{args.model}, {args.ranks} rank(s){' ' + args.parallel if args.ranks > 1 else ''}, {len(tokens)} tokens")
    print(f"| way | perplexity | largest per-token difference |\n|---|---|---|")
    print(f"| API (echo, logprobs, max_tokens 0) | {api_ppl:.6f} | {worst:.2e} |")
    print(f"| mlx-lm in-process | {local_ppl:.6f} | |")
    agree = abs(api_ppl - local_ppl) <= args.tolerance * local_ppl
    print("agree" if agree else f"differ by more than {args.tolerance:g} (relative)")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
