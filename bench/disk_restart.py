"""Turn N+1 of a conversation after `restart-engine`: time to first token restored from the disk tier against
computed cold (the engine restarted with PROMPT_CACHE_DISK_BYTES=0), on one or more ranks.

    .venv/bin/python -m bench.disk_restart [--model smollm2-135m] [--tokens 7500] [--ranks 1]

Each request asks for one token, so its latency is its time to first token. Rows: turn N+1 served from RAM (no
restart), restored from disk after the restart, computed cold; then the engine's restore rate (rank 0's
bytes_restored / seconds_restoring from /health) against a plain read of the same file, its pages dropped first.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from bench.disk_tier import drop
from tests.harness import Stack, wait_for

DISK_BYTES = str(4 << 30)
# A cold 8k-token prefill of the real model takes 20 min on a quiet 2-core CPU and over 30 loaded: wait for it.
LONGEST = 5400


def ask(stack: Stack, messages: list[dict]) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=LONGEST, json={
        "model": "default", "messages": messages, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0, r.json()


def disk(stack: Stack) -> dict:
    r = httpx.get(stack.base_url + "/health", timeout=10)
    return r.json().get("prompt_cache_disk", {}) if r.status_code == 200 else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=7500, help="about how long turn N is")
    ap.add_argument("--ranks", type=int, default=1)
    args = ap.parse_args()
    words = " ".join(f"Step {i}: open file src/mod{i % 41}.py, read line {i * 7 % 300}, note what it does."
                     for i in range(args.tokens // 28))
    first = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": words}]
    folder = Path(tempfile.mkdtemp(prefix="disk-restart-"))
    s = Stack(extra={"MODEL": args.model, "PROMPT_CACHE_BYTES": str(2 << 30), "PROMPT_CACHE_DISK_BYTES": DISK_BYTES,
                     "PROMPT_CACHE_DIR": str(folder),
                     "WATCHDOG_TIMEOUT": "600", "REQUEST_TIMEOUT": str(LONGEST)})
    engine, api = s.start_engine(ranks=args.ranks, timeout=600), s.start_api()
    try:
        wait_for(lambda: disk(s).get("cap_bytes"), 120, "the disk tier to open")
        cold_one, one = ask(s, first)
        wait_for(lambda: disk(s).get("entries"), 120, "turn N on disk")
        turn = first + [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "Now summarise what you read in one line."}]
        # another follow-up on the same turn N: served from RAM, and not the prompt the restarts below restore
        ram_s, ram_body = ask(s, turn[:-1] + [{"role": "user", "content": "Now list the files you read."}])
        rows = [("RAM hit", ram_s, ram_body["usage"]["prompt_tokens"],
                 ram_body["usage"]["prompt_tokens_details"]["cached_tokens"], disk(s))]
        for label, disk_bytes in (("restored", DISK_BYTES), ("cold", "0")):
            engine.stop()
            engine = s.start_engine(ranks=args.ranks, timeout=600, PROMPT_CACHE_DISK_BYTES=disk_bytes)
            if disk_bytes != "0":
                wait_for(lambda: disk(s).get("cap_bytes"), 120, "the restarted engine's disk tier")
            else:
                wait_for(lambda: disk(s) != {}, 120, "the restarted engine")
            seconds, body = ask(s, turn)
            rows.append((label, seconds, body["usage"]["prompt_tokens"],
                         body["usage"]["prompt_tokens_details"]["cached_tokens"], disk(s)))
        restored, cold = rows[1][1], rows[2][1]
        print(f"{args.model}, {args.ranks} rank(s), turn N {one['usage']['prompt_tokens']} tokens "
              f"(computed in {cold_one:.2f} s); {rows[1][4].get('bytes', 0) / 2**20:.1f} MiB on rank 0's disk")
        for label, seconds, prompt, cached, _ in rows:
            where = "no restart" if label == "RAM hit" else "after restart-engine"
            print(f"  turn N+1, {label:8} ({where:20}): TTFT {seconds:7.2f} s, {prompt} prompt tokens, "
                  f"{cached} cached")
        print(f"  restored / cold: {restored / cold:.3f}")
        st = rows[1][4]
        engine_rate = st.get("bytes_restored", 0) / max(1e-9, st.get("seconds_restoring", 0.0))
        path = max(folder.rglob("*.kv"), key=lambda p: p.stat().st_size)
        drop(path)
        start = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            size = len(f.read())
        plain = size / (time.perf_counter() - start)
        print(f"  restore rate (rank 0, /health): {st.get('bytes_restored', 0) / 2**20:.1f} MiB in "
              f"{st.get('seconds_restoring', 0.0) * 1e3:.0f} ms = {engine_rate / 1e9:.2f} GB/s; plain read of the "
              f"largest file ({size / 2**20:.1f} MiB, pages dropped): {plain / 1e9:.2f} GB/s; "
              f"ratio {engine_rate / plain:.2f}")
    finally:
        api.stop()
        engine.stop()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
