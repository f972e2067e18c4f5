"""mlx-lm alone, one rank of it under mlx.launch: load MODEL pipelined (sharded_load(pipeline_group=...)), or
with MODE `tensor` sharded (sharded_load(tensor_group=...)), and write the greedy tokens of each prompt, as
mlx_lm.generate gives them, to OUT (rank 0). MODE `whole`: one process, mlx_lm.load, no mlx.launch (the
reference for a model mlx-lm cannot pipeline, since a pipeline computes every layer whole).

    mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- python mlx_lm_pipelined.py MODEL PROMPTS OUT [MODE]

PROMPTS is a JSON file: [{"tokens": [...], "max_tokens": n}, ...]. Nothing of the project is imported:
this is the reference the engine's pipelined serving is checked against.
"""

from __future__ import annotations

import json
import os
import sys

import mlx.core as mx
from mlx_lm.generate import stream_generate
from mlx_lm.utils import load, sharded_load


def main() -> int:
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # keep mlx.launch's stdin forwarding quiet
    model_path, prompts_file, out = sys.argv[1:4]
    mode = sys.argv[4] if len(sys.argv) > 4 else "pipeline"
    if mode == "whole":
        group, (model, tokenizer) = None, load(model_path)
    else:
        group = mx.distributed.init(strict=True, backend="ring")
        model, tokenizer = sharded_load(model_path, **{f"{mode}_group": group})
    with open(prompts_file) as f:
        prompts = json.load(f)
    results = []
    for p in prompts:
        steps = list(stream_generate(model, tokenizer, p["tokens"], max_tokens=p["max_tokens"],
                                     sampler=lambda logprobs: mx.argmax(logprobs, axis=-1)))
        # the end-of-sequence token ends the answer without being part of it
        tokens = [r.token for r in steps if not (r.finish_reason == "stop" and r is steps[-1])]
        results.append({"tokens": tokens, "text": tokenizer.decode(tokens)})
    # generate_step evaluates one step ahead: no rank may leave while another still exchanges that step
    if group is not None:
        mx.eval(mx.distributed.all_sum(mx.array(1.0), group=group, stream=mx.cpu))
    if group is None or group.rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
