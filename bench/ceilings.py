"""In-process mlx-lm ceilings: what the same model does with no server around it.

Run as a script, alone or on every rank under mlx.launch (each rank loading its shard with
sharded_load, running the same prompts; rank 0 decides when to stop). It prints one
`BENCH-RESULT {json}` line (rank 0 only); under mlx.launch every rank first prints
`BENCH-DETACHED` once its stdin points at /dev/null, so the orchestrator knows when the
launcher's stdin byte will quiet it.

    python -m bench.ceilings stream --model PATH --prompts '["hi", ...]' --max-tokens 128
    python -m bench.ceilings batch  --model PATH --prompts '[...8 prompts...]' --max-tokens 128
    mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- \
        python -m bench.ceilings batch --model PATH --prompts '[...]' [--plan-broadcast]
    mlx.launch --hosts 127.0.0.1,127.0.0.1 --backend ring -- \
        python -m bench.ceilings stream --model PATH --prompts '["hi", ...]'
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__" and "MLX_RANK" in os.environ:
    # Before anything else: mlx.launch's forwarding thread spins until our stdin is gone.
    _fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(_fd, 0)
    os.close(_fd)
    print(f"BENCH-DETACHED rank={os.environ['MLX_RANK']}", flush=True)

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

MAX_REPS = 8  # as bench/run.py


def _load(path: str):
    import mlx.core as mx
    from mlx_lm import load
    from mlx_lm.utils import sharded_load

    group = mx.distributed.init() if "MLX_RANK" in os.environ else None
    if group is not None and group.size() > 1:
        model, tokenizer = sharded_load(path, tensor_group=group)
        return model, tokenizer, group.rank(), group.size()
    model, tokenizer = load(path)
    return model, tokenizer, 0, 1


def _eos(path: str) -> list[int]:
    with open(os.path.join(path, "config.json")) as f:
        eos = json.load(f).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def chat_tokens(tokenizer, content: str) -> list[int]:
    """The prompt exactly as our engine builds it (engine/rank0/admission.py Prompter)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def run_stream(model, tokenizer, prompts: list[str], max_tokens: int, bias: dict[int, float],
               min_seconds: float) -> dict:
    """mlx_lm.stream_generate, one prompt after the other: the single-stream ceiling."""
    from mlx_lm import stream_generate
    from mlx_lm.sample_utils import make_logits_processors

    def once(content: str, n: int) -> dict:
        procs = make_logits_processors(logit_bias=bias)
        t0 = time.perf_counter()
        times, tokens = [], 0
        for r in stream_generate(model, tokenizer, chat_tokens(tokenizer, content), max_tokens=n,
                                 logits_processors=procs):
            times.append(time.perf_counter())
            tokens = r.generation_tokens
        return {"tokens": tokens, "ttft_s": times[0] - t0, "decode_tps": (len(times) - 1) / (times[-1] - times[0]),
                "e2e_tps": tokens / (times[-1] - t0)}

    once("warm up", 8)
    runs, t0 = [], time.perf_counter()
    # Under mlx.launch each rank's clock differs: a rank deciding alone to run once more would wait forever.
    while _agree(len(runs) < len(prompts) or (time.perf_counter() - t0 < min_seconds and len(runs) < MAX_REPS)):
        runs.append(once(prompts[len(runs) % len(prompts)], max_tokens))
    return summarize_stream(runs)


def summarize_stream(runs: list[dict]) -> dict:
    """Best run (others' processes only slow a run down) and median, as bench/clients.py reports."""
    return {"runs": runs, "decode_tps": max(r["decode_tps"] for r in runs),
            "decode_tps_median": statistics.median(r["decode_tps"] for r in runs),
            "e2e_tps": max(r["e2e_tps"] for r in runs),
            "ttft_p50_s": statistics.median(r["ttft_s"] for r in runs)}


def _all_ranks_cpu(seconds: float) -> float:
    """This process's CPU seconds summed over every rank (each rank is a process of its own)."""
    import mlx.core as mx

    if "MLX_RANK" not in os.environ:
        return seconds
    return float(mx.distributed.all_sum(mx.array(seconds, dtype=mx.float32)).item())


def _agree(flag: bool) -> bool:
    """Rank 0's decision on every rank (a loop that ends on one rank only would hang the other)."""
    import mlx.core as mx

    if "MLX_RANK" not in os.environ:
        return flag
    mine = 1 if flag and os.environ["MLX_RANK"] == "0" else 0
    return bool(mx.distributed.all_sum(mx.array(mine, dtype=mx.int32)).item())


def batch_once(model, tokenizer, contents: list[str], n: int, bias: dict[int, float], eos: list[int],
               plan_broadcast: bool = False) -> dict:
    """One BatchGenerator run: every prompt inserted at once, greedy, stepped until all finish (with
    plan_broadcast under mlx.launch, every step first meets through a PlanChannel, as our engine does)."""
    import mlx.core as mx
    from mlx_lm.generate import BatchGenerator
    from mlx_lm.sample_utils import make_logits_processors

    gen = BatchGenerator(model, stop_tokens=[[t] for t in eos], completion_batch_size=32, prefill_batch_size=8)
    channel = None
    if plan_broadcast and "MLX_RANK" in os.environ:
        from engine.lockstep.channel import PlanChannel

        channel = PlanChannel(mx.distributed.init(), 4096, gen.stream)
    t0, c0 = time.perf_counter(), time.process_time()
    gen.insert([chat_tokens(tokenizer, c) for c in contents], max_tokens=[n] * len(contents),
               logits_processors=[make_logits_processors(logit_bias=bias) for _ in contents])
    tokens, live, steps, full_steps, t_full = 0, len(contents), 0, 0, None
    while live:
        if channel is not None:
            from engine.lockstep.plan import Plan

            channel.broadcast(Plan(step=steps, fingerprint=0, token_check=0) if channel.rank == 0 else None)
        _, responses = gen.next()
        tokens += len(responses)
        live -= sum(1 for r in responses if r.finish_reason is not None)
        if len(responses) == len(contents):  # a pure decode step with the whole batch
            t_full = t_full or time.perf_counter()
            full_steps += 1
        steps += 1
    wall, cpu_s = time.perf_counter() - t0, _all_ranks_cpu(time.process_time() - c0)
    gen.close()
    step_s = (time.perf_counter() - t_full) / max(full_steps - 1, 1) if t_full else float("nan")
    return {"tokens": tokens, "wall_s": wall, "aggregate_tps": tokens / wall, "steps": steps,
            "decode_step_ms": 1000 * step_s, "decode_tps": len(contents) / step_s,
            "cpu_ms_per_token": 1000 * cpu_s / tokens}


def run_batch(model, tokenizer, prompts: list[str], max_tokens: int, bias: dict[int, float], eos: list[int],
              repeats: int, min_seconds: float, plan_broadcast: bool = False) -> dict:
    """batch_once, repeated (best and median kept).

    With plan_broadcast every step first meets through engine.lockstep.channel.PlanChannel, as our engine's
    lockstep loop does: the in-process cost of lockstep, without any HTTP or scheduling."""
    def once(contents: list[str], n: int) -> dict:
        return batch_once(model, tokenizer, contents, n, bias, eos, plan_broadcast)

    once(contents=prompts[:2], n=8)
    runs, t0 = [], time.perf_counter()
    while _agree(len(runs) < repeats or (time.perf_counter() - t0 < min_seconds and len(runs) < MAX_REPS)):
        runs.append(once(prompts, max_tokens))
    return summarize_batch(runs, len(prompts))


def summarize_batch(runs: list[dict], sequences: int) -> dict:
    return {"runs": runs, "sequences": sequences,
            "aggregate_tps": max(r["aggregate_tps"] for r in runs),
            "aggregate_tps_median": statistics.median(r["aggregate_tps"] for r in runs),
            "decode_step_ms": min(r["decode_step_ms"] for r in runs),
            "decode_tps": max(r["decode_tps"] for r in runs),
            "decode_tps_median": statistics.median(r["decode_tps"] for r in runs),
            "cpu_ms_per_token": statistics.median(r["cpu_ms_per_token"] for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["stream", "batch"])
    parser.add_argument("--model", required=True, help="model folder")
    parser.add_argument("--prompts", required=True, help="JSON list of user messages")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--min-seconds", type=float, default=0.0, help="repeat (up to 8 runs) until this long")
    parser.add_argument("--plan-broadcast", action="store_true",
                        help="batch under mlx.launch: meet through PlanChannel.broadcast before every step")
    args = parser.parse_args()
    prompts = json.loads(args.prompts)
    model, tokenizer, rank, size = _load(args.model)
    eos = _eos(args.model)
    bias = {t: -100.0 for t in eos}
    if args.mode == "stream":
        result = run_stream(model, tokenizer, prompts, args.max_tokens, bias, args.min_seconds)
    else:
        result = run_batch(model, tokenizer, prompts, args.max_tokens, bias, eos, args.repeats, args.min_seconds,
                           args.plan_broadcast)
    result.update(mode=args.mode, ranks=size)
    if rank == 0:
        print("BENCH-RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
