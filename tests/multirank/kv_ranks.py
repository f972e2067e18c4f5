"""One rank of tests/multirank/test_kv_memory_two_ranks.py under mlx.launch: load this rank's shard and measure
its caches as the engine does, then prefill TOKENS tokens into the model's own cache and write both."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from config import load_settings
from engine.kv_measure import measure
from engine.loading import load


def main(out: Path, tokens: int) -> None:
    group = mx.distributed.init(strict=True, backend="ring")
    model = load(load_settings(), group).model
    memory = measure(model)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([list(range(1, tokens + 1))]), cache=cache))
    (out / f"rank{group.rank()}.json").write_text(json.dumps(
        {"memory": memory.row(), "real": sum(c.nbytes for c in cache)}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
