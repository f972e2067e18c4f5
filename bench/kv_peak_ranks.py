"""MLX peak memory of each rank during one long prefill, served: one engine per KV precision and rank count, started
in turn, one prompt of --tokens token ids sent through the API (max_tokens 4), then every rank's peak from /metrics
(`mcs_rank_memory_bytes{kind="peak"}`) less its peak after load. Prints a Markdown table.

    .venv/bin/python -m bench.kv_peak_ranks --model zoo-llama-wide --cache-dir .cache/models --tokens 8192 \
        --configs off,8/64,4/64 --ranks 1,2
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.kv_quality import Config  # noqa: E402


def rank_gauges(base_url: str) -> dict[int, dict[str, float]]:
    """Each rank's memory gauges (active, cache, peak) and report age, from /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[int, dict[str, float]] = {}
    for family in text_string_to_metric_families(httpx.get(base_url + "/metrics", timeout=30).text):
        for s in family.samples:
            if s.name == "mcs_rank_memory_bytes":
                out.setdefault(int(s.labels["rank"]), {})[s.labels["kind"]] = s.value
            elif s.name == "mcs_rank_report_age_seconds":
                out.setdefault(int(s.labels["rank"]), {})["age"] = s.value
    return out


def reported_since(base_url: str, since: float, timeout: float = 120) -> dict[int, dict[str, float]]:
    """The gauges once every rank has reported after `since` (time.monotonic())."""
    deadline = time.monotonic() + timeout
    while True:
        gauges = rank_gauges(base_url)
        if gauges and all(g.get("age", 1e9) < time.monotonic() - since for g in gauges.values()):
            return gauges
        if time.monotonic() > deadline:
            raise RuntimeError(f"{base_url}: no rank report after the request within {timeout} s")
        time.sleep(0.5)


def measure(model: str, cache_dir: Path, config: Config, ranks: int, tokens: int, parallel: str) -> dict:
    from bench import servers

    work = servers.Workdir()
    server = servers.start_ours(work, model, cache_dir, ranks, timeout=900, PROMPT_CACHE_BYTES="0",
                                PARALLEL=parallel, WATCHDOG_TIMEOUT="1800", REQUEST_TIMEOUT="3600", **config.env())
    try:
        loaded = reported_since(server.base_url, time.monotonic())
        prompt = [3 + (i * 7) % 1000 for i in range(tokens)]
        started = time.monotonic()
        r = httpx.post(server.base_url + "/v1/completions", timeout=3600, json={
            "model": "default", "prompt": prompt, "max_tokens": 4, "temperature": 0})
        r.raise_for_status()
        took = time.monotonic() - started
        after = reported_since(server.base_url, time.monotonic())
    finally:
        server.stop()
        work.finish(keep=False)
    return {"took": took, "ranks": {k: (loaded[k]["peak"], after[k]["peak"] - loaded[k]["peak"]) for k in after}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="zoo-llama-wide")
    ap.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "mlx-cluster-serve")
    ap.add_argument("--configs", default="off,8/64,4/64")
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--parallel", default="tensor", help="PARALLEL for more than one rank")
    args = ap.parse_args(argv)
    configs = [Config.parse(c) for c in args.configs.split(",")]
    print(f"{args.model}: MLX peak of each rank during a {args.tokens}-token prefill and 4 decoded tokens, less its "
          "peak after load (MiB), through the API\n")
    print("| ranks | KV | rank | peak after load | peak added by the request | vs float | prefill + 4 tokens |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    for ranks in (int(n) for n in args.ranks.split(",")):
        base: dict[int, float] = {}
        for config in configs:
            got = measure(args.model, args.cache_dir, config, ranks, args.tokens, args.parallel)
            for rank, (loaded, added) in sorted(got["ranks"].items()):
                base.setdefault(rank, added)
                print(f"| {ranks}{' ' + args.parallel if ranks > 1 else ''} | {config} | {rank} | "
                      f"{loaded / 2**20:.1f} | {added / 2**20:.1f} | {added / base[rank]:.2f}x | {got['took']:.0f} s |",
                      flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
