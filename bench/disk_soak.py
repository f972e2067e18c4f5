"""The prefix cache's disk tier under load: the step-time cost of spilling (the same concurrent conversations served
with PROMPT_CACHE_DISK_BYTES=0 and on), and the byte cap held under a soak that writes more than the cap.
Entries written counts files; a longer turn's entry replaces the shorter one of the same conversation (deleted, not
evicted), so written - evicted - left is the replaced.

    .venv/bin/python -m bench.disk_soak [--model demo-tiny] [--conversations 4] [--turns 3] [--tokens 1500]
        [--soak 24] [--cap-entries 3]

Inter-token latency is the gap between streamed content chunks (one token each); the cap soak runs --soak
distinct conversations against a cap of --cap-entries times the largest entry the spill run wrote, then compares
`du` of the tier's folder with the cap. Prints Markdown tables.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import httpx

from tests.harness import Stack, wait_for

ANSWER = 48  # tokens streamed a turn: the inter-token gaps measured


def words(tag: str, tokens: int) -> str:
    return f"[{tag}] " + " ".join(f"Step {i}: open src/mod{i % 41}.py line {i * 7 % 300}, note it."
                                   for i in range(tokens // 20))


def stream(stack: Stack, messages: list[dict], max_tokens: int) -> tuple[str, list[float]]:
    """The answer and the gaps between its streamed chunks (seconds); raises on any error."""
    text, gaps, last = [], [], None
    with httpx.stream("POST", stack.base_url + "/v1/chat/completions", timeout=1800, json={
            "model": "default", "messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{r.status_code}: {r.read()!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            body = json.loads(line[6:])
            if "error" in body:
                raise RuntimeError(str(body["error"]))
            delta = body["choices"][0]["delta"].get("content") if body.get("choices") else None
            if delta:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
                text.append(delta)
    return "".join(text), gaps


def conversation(stack: Stack, tag: str, turns: int, tokens: int, gaps: list[float], errors: list[str]) -> None:
    messages = [{"role": "system", "content": "You are a coding agent."},
                {"role": "user", "content": words(tag, tokens)}]
    try:
        for t in range(turns):
            answer, g = stream(stack, messages, ANSWER)
            gaps.extend(g)
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": words(f"{tag} turn {t + 1}", tokens // 4)}]
    except Exception as exc:  # counted, not raised: the soak reports every error
        errors.append(f"{tag}: {exc}")


def disk(stack: Stack) -> dict:
    r = httpx.get(stack.base_url + "/health", timeout=10)
    return r.json().get("prompt_cache_disk", {}) if r.status_code == 200 else {}


def metrics(stack: Stack) -> dict[str, str]:
    text = httpx.get(stack.base_url + "/metrics", timeout=10).text
    return {ln.split()[0]: ln.split()[1] for ln in text.splitlines()
            if ln.startswith("mcs_prompt_cache_disk_") and not ln.startswith("#")}


def du(folder: Path) -> int:
    return int(subprocess.run(["du", "-sb", str(folder)], capture_output=True, text=True, check=True).stdout.split()[0])


def serve(model: str, folder: Path, disk_bytes: int, ram_bytes: int, tags: list[str], turns: int, tokens: int,
          parallel: int) -> tuple[list[float], list[str], dict, dict, float]:
    """Serve the conversations `parallel` at a time; (gaps, errors, /health disk block, /metrics disk, seconds)."""
    s = Stack(extra={"MODEL": model, "PROMPT_CACHE_BYTES": str(ram_bytes), "PROMPT_CACHE_DIR": str(folder),
                     "PROMPT_CACHE_DISK_BYTES": str(disk_bytes), "WATCHDOG_TIMEOUT": "600", "REQUEST_TIMEOUT": "1800"})
    engine, api = s.start_engine(timeout=600), s.start_api()
    try:
        wait_for(lambda: disk(s) != {} and (disk_bytes == 0 or disk(s).get("cap_bytes")), 120, "the engine")
        gaps: list[float] = []
        errors: list[str] = []
        start = time.perf_counter()
        for i in range(0, len(tags), parallel):
            threads = [threading.Thread(target=conversation, args=(s, tag, turns, tokens, gaps, errors))
                       for tag in tags[i:i + parallel]]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        took = time.perf_counter() - start
        if disk_bytes:
            wait_for(lambda: disk(s).get("writes", 0) >= 1, 60, "a write")
            time.sleep(2)  # the writer thread finishes what the last turns queued
        return gaps, errors, disk(s), metrics(s), took
    finally:
        api.stop()
        engine.stop()


def pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] * 1e3 if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="demo-tiny")
    ap.add_argument("--conversations", type=int, default=4)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1500, help="about how long each opening prompt is")
    ap.add_argument("--ram", type=int, default=64 << 20, help="PROMPT_CACHE_BYTES: small, so the RAM tier evicts")
    ap.add_argument("--soak", type=int, default=24, help="distinct conversations of the cap soak")
    ap.add_argument("--cap-entries", type=int, default=3)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="disk-soak-"))
    try:
        tags = [f"conv {i}" for i in range(args.conversations)]
        rows = {}
        for label, cap in (("off (0)", 0), ("on (4 GiB)", 4 << 30)):
            rows[label] = serve(args.model, root / label.split()[0], cap, args.ram, tags, args.turns, args.tokens,
                                args.conversations)
        print(f"\n{args.model}: {args.conversations} concurrent conversations x {args.turns} turns, opening "
              f"~{args.tokens} tokens, PROMPT_CACHE_BYTES {args.ram >> 20} MiB, {ANSWER} tokens streamed a turn\n")
        print("| disk tier | inter-token median ms | p95 ms | chunks | errors | served in s | entries written | "
              "bytes on disk after |\n|---|---|---|---|---|---|---|---|")
        for label, (gaps, errors, health, _, took) in rows.items():
            print(f"| {label} | {pct(gaps, 0.5):.1f} | {pct(gaps, 0.95):.1f} | {len(gaps)} | {len(errors)} | "
                  f"{took:.1f} | {health.get('writes', 0)} | {health.get('bytes', 0) / 2**20:.1f} MiB |")
        on = rows["on (4 GiB)"]
        print("\n/metrics after the spill run: " + ", ".join(f"{k} {v}" for k, v in sorted(on[3].items())))
        entry = max(1, on[2].get("bytes", 0) // max(1, on[2].get("entries", 1)))
        cap = args.cap_entries * entry * 3 // 2  # room for cap-entries entries of the larger (later-turn) kind
        soak_tags = [f"soak {i}" for i in range(args.soak)]
        gaps, errors, health, _, took = serve(args.model, root / "soak", cap, args.ram, soak_tags, 2, args.tokens, 2)
        held = du(root / "soak")
        files = sum(p.stat().st_size for p in (root / "soak").rglob("*.kv"))
        print(f"\ncap soak: {args.soak} distinct conversations x 2 turns, 2 at a time, cap {cap / 2**20:.1f} MiB "
              f"(~{args.cap_entries}x a mean entry of {entry / 2**20:.2f} MiB), served in {took:.0f} s\n")
        print("| entries written | evicted | entries left | .kv bytes | du of the folder | cap | under cap | "
              "errors |\n|---|---|---|---|---|---|---|---|")
        print(f"| {health.get('writes', 0)} | {health.get('evictions', 0)} | {health.get('entries', 0)} | "
              f"{files / 2**20:.2f} MiB | {held / 2**20:.2f} MiB | {cap / 2**20:.2f} MiB | "
              f"{'yes' if files <= cap else 'NO'} | {len(errors)} |")
        for e in errors[:5]:
            print("error:", e)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
