"""A soak of agent replays with a prefix cache budget far below the working set: memory stays bounded.

    .venv/bin/python -m bench.cache_soak                          # 6 sessions x 3 rounds, 8 MiB budget
    .venv/bin/python -m bench.cache_soak --sessions 8 --rounds 5 --budget-mib 4 --ranks 2

Starts its own engine (demo-tiny) and API on free ports with PROMPT_CACHE_BYTES far below what the
sessions would keep (each session: its own ~3k-token system prompt, then 8 turns), runs the
sessions concurrently for several rounds, and samples the engine's resident memory (every rank's)
every half second. The same run with the cache off (PROMPT_CACHE_BYTES=0) comes first: its peak is
what the weights, the runtime and a full batch of these sessions take. It passes when no request
failed, evictions happened, the cache never held more than its budget, and every rank's peak RSS
with the cache stayed within 10 % of that peak + the budget. Prints a table; exit 0 on pass, 1 on
fail.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.harness import Stack  # noqa: E402

TURNS = 8


def system_prompt(session: int) -> str:
    """~3k demo tokens, different for every session: no session can serve another from the cache."""
    return " ".join(f"Session {session} rule {i}: answer in one line and cite file {i % 11}.py." for i in range(160))


def rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Peak RSS of each rank process, sampled every half second."""

    def __init__(self, pids: list[int]) -> None:
        super().__init__(daemon=True)
        self.pids, self.peak = pids, dict.fromkeys(pids, 0)
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.wait(0.5):
            for pid in self.pids:
                self.peak[pid] = max(self.peak[pid], rss_kib(pid))


async def session(client: httpx.AsyncClient, base: str, n: int, failures: list[str]) -> None:
    messages = [{"role": "system", "content": system_prompt(n)}]
    for turn in range(TURNS):
        messages.append({"role": "user", "content": f"Turn {turn}: which rule names file {turn}.py?"})
        r = await client.post(base + "/v1/chat/completions", json={
            "model": "default", "messages": messages, "max_tokens": 16, "temperature": 0})
        if r.status_code != 200:
            failures.append(f"session {n} turn {turn}: {r.status_code} {r.text[:200]}")
            return
        messages.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})


async def rounds(base: str, sessions: int, count: int, failures: list[str]) -> None:
    async with httpx.AsyncClient(timeout=600) as client:
        for r in range(count):
            # every round starts fresh conversations, so the working set keeps moving through the budget
            await asyncio.gather(*(session(client, base, r * sessions + i, failures) for i in range(sessions)))


def rank_pids(stack: Stack) -> list[int]:
    info = stack.probe() or {}
    return [r["pid"] for r in info.get("rank_states", []) if r.get("pid")]


def soak(args: argparse.Namespace, budget: int) -> dict:
    """One run: {"idle", "peak"} KiB per rank, the engine's last Info, the failures and the seconds."""
    stack = Stack(extra={"PROMPT_CACHE_BYTES": str(budget), "MAX_BATCH": str(args.sessions)})
    engine = stack.start_engine(ranks=args.ranks)
    api = stack.start_api()
    failures: list[str] = []
    try:
        pids = rank_pids(stack)
        idle = {pid: rss_kib(pid) for pid in pids}
        sampler = Sampler(pids)
        sampler.start()
        started = time.monotonic()
        asyncio.run(rounds(stack.base_url, args.sessions, args.rounds, failures))
        seconds = time.monotonic() - started
        sampler.stop.set()
        sampler.join()
        end = stack.probe()
    finally:
        api.stop()
        engine.stop()
    return {"idle": list(idle.values()), "peak": list(sampler.peak.values()), "info": end, "failures": failures,
            "seconds": seconds}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget-mib", type=float, default=8.0)
    ap.add_argument("--ranks", type=int, default=1)
    args = ap.parse_args()
    budget = int(args.budget_mib * 2**20)
    off = soak(args, 0)
    on = soak(args, budget)
    end = on["info"]
    print(f"\n{args.sessions} sessions x {args.rounds} rounds x {TURNS} turns on {args.ranks} rank(s); "
          f"{off['seconds']:.0f} s with the cache off, {on['seconds']:.0f} s with {budget / 2**20:.1f} MiB per rank\n")
    print("| rank | idle RSS | peak RSS, cache off | + budget | = allowed | peak RSS, cache on | on / allowed |")
    print("|---|---|---|---|---|---|---|")
    ok = True
    for rank, (idle, peak_off, peak_on) in enumerate(zip(on["idle"], off["peak"], on["peak"])):
        allowed = peak_off + budget // 1024
        ratio = peak_on / allowed if allowed else 0
        ok &= ratio <= 1.10
        print(f"| {rank} | {idle / 1024:.0f} MiB | {peak_off / 1024:.0f} MiB | {budget / 2**20:.0f} MiB | "
              f"{allowed / 1024:.0f} MiB | {peak_on / 1024:.0f} MiB | {ratio:.2f} |")
    print(f"\nprefix cache at the end: {end['prompt_cache_entries']} entries, "
          f"{end['prompt_cache_bytes'] / 2**20:.1f} MiB; {end['prompt_cache_hits']} hits, "
          f"{end['prompt_cache_misses']} misses, {end['prompt_cache_evictions']} evictions; "
          f"{end['prompt_tokens_cached']} of {end['prompt_tokens_total']} prompt tokens from the cache")
    checks = {
        "no request failed": not (on["failures"] or off["failures"]),
        "evictions happened": end["prompt_cache_evictions"] > 0,
        "the cache stayed within its budget": end["prompt_cache_bytes"] <= budget,
        "peak RSS within 10 % of the cache-off peak + the budget on every rank": ok,
        "the engine ended idle": end["active"] == 0 and end["queued"] == 0,
    }
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name}")
    for f in (on["failures"] + off["failures"])[:10]:
        print("  ", f)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
