"""`python -m bench.agent_replay`: what the prefix cache buys an agent, on 1 and 2 ranks, in one run.

Prints Markdown tables, writes bench/results/<timestamp>-agent-<model>.json and a PNG next to it.
See bench/README.md ("Agent replay") for what is measured and how to read it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

if __package__ in (None, ""):  # `python bench/agent_replay.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import agent_workload as wl  # noqa: E402
from bench import cpu  # noqa: E402
from bench.clients import percentile  # noqa: E402
from bench.report import num, table  # noqa: E402
from bench.run import resolve_model  # noqa: E402
from bench.servers import REPO, Server, Workdir, shown, start_ours  # noqa: E402

TURN2_TARGET = 0.2  # cached turn 2 TTFT over the same turn with nothing cached
COMPUTED_TARGET = 0.25  # prompt tokens computed over prompt tokens received, N sessions
# An uncached 3k-token prefill of demo-small takes a minute or more on a busy 2-core CPU.
REQUEST_TIMEOUT = 1800.0


@dataclass
class Options:
    """What to measure; --quick is a smaller version of the same on demo-tiny."""

    model: str = "demo-small"
    ranks: list[int] = field(default_factory=lambda: [1, 2])
    turns: int = 8
    reps: int = 3
    sessions: int = 8
    max_tokens: int = 16
    system_tokens: int = 3000
    cache_bytes: int = -1  # PROMPT_CACHE_BYTES of the cache-on server (-1: the engine's default sizing)
    cold_sessions: bool = False
    quiet_wait: float = 5.0
    quiet_threshold: float = 0.5
    cache_dir: Path = REPO / ".cache" / "models"


def quick(opts: Options) -> Options:
    return replace(opts, turns=4, reps=2, sessions=4)


@dataclass
class Reply:
    """One streamed chat completion as the client saw it (times from time.perf_counter())."""

    sent: float
    first: float | None = None
    first_from: str = ""  # "output": first content/tool call; "finish": nothing visible came before the finish
    done: float = 0.0
    content: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    other_load: float = math.nan  # cores other people's processes used meanwhile

    @property
    def ttft(self) -> float:
        return self.first - self.sent if self.first is not None else math.nan

    def message(self) -> dict:
        """The assistant's message as an agent appends it to the conversation."""
        msg: dict = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def output(self) -> tuple:
        """What must not depend on the cache (tool call ids are random per request)."""
        calls = [(c["function"]["name"], c["function"]["arguments"]) for c in self.tool_calls]
        return self.content, calls, self.finish_reason, self.prompt_tokens, self.completion_tokens


class Client:
    """Streaming chat requests to one server, greedy, with the tools of the workload."""

    def __init__(self, http: httpx.AsyncClient, server: Server, opts: Options, eos: list[int]):
        self.http, self.server, self.opts = http, server, opts
        # Answers run to max_tokens whatever the random demo weights make of EOS: every turn grows alike.
        self.bias = {str(t): -100 for t in eos}

    async def send(self, messages: list[dict], tools: bool = True) -> Reply:
        body = {"model": "default", "messages": messages, "max_tokens": self.opts.max_tokens,
                "temperature": 0, "logit_bias": self.bias, "stream": True,
                "stream_options": {"include_usage": True}}
        if tools:
            body["tools"] = wl.TOOLS
        r = Reply(sent=time.perf_counter())
        async with self.http.stream("POST", self.server.base_url + "/v1/chat/completions", json=body) as resp:
            if resp.status_code != 200:
                raise RuntimeError(f"{self.server.label}: HTTP {resp.status_code}: {(await resp.aread())[:300]!r}")
            async for line in resp.aiter_lines():
                if line.startswith("data:") and self._event(r, line[5:].strip()):
                    break
        r.done = time.perf_counter()
        if r.first is None:
            raise RuntimeError(f"{self.server.label}: the stream ended without a token")
        return r

    @staticmethod
    def _event(r: Reply, payload: str) -> bool:
        """Fold one SSE event into r; True at the end of the stream."""
        if payload == "[DONE]":
            return True
        obj = json.loads(payload)
        if "error" in obj:
            raise RuntimeError(f"error in the stream: {obj['error']}")
        now = time.perf_counter()
        for choice in obj.get("choices") or ():
            delta = choice.get("delta") or {}
            text = delta.get("content") or ""
            calls = delta.get("tool_calls") or []
            produced = bool(text or calls or delta.get("reasoning_content"))
            # The first chunk (role, empty content) leaves before any token: it does not count.
            if r.first is None and (produced or choice.get("finish_reason")):
                r.first, r.first_from = now, "output" if produced else "finish"
            r.content += text
            r.tool_calls += [{"id": c.get("id") or "", "type": "function", "function": c["function"]} for c in calls]
            r.finish_reason = choice.get("finish_reason") or r.finish_reason
        usage = obj.get("usage")
        if usage:
            r.prompt_tokens = usage["prompt_tokens"]
            r.completion_tokens = usage["completion_tokens"]
            r.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        return False

    async def timed(self, messages: list[dict]) -> Reply:
        """send() on a quiet host (bounded wait), tagged with the load others put on it meanwhile."""
        if self.opts.quiet_wait > 0:
            await asyncio.to_thread(cpu.wait_quiet, self.opts.quiet_threshold, self.opts.quiet_wait)
        load = cpu.HostLoad()
        r = await self.send(messages)
        r.other_load = load.foreign_cores()
        return r

    async def tokens(self, messages: list[dict]) -> int:
        """Prompt tokens of a chat as the server renders it (its /tokenize)."""
        resp = await self.http.post(self.server.base_url + "/tokenize",
                                    json={"model": "default", "messages": messages, "tools": wl.TOOLS})
        resp.raise_for_status()
        return int(resp.json()["count"])

    async def counters(self) -> dict[str, float]:
        """The engine's prompt token counters from /metrics (they need the engine's Info: retried)."""
        names = ("mcs_engine_prompt_tokens_total", "mcs_prompt_cache_tokens_total")
        for _ in range(20):
            text = (await self.http.get(self.server.base_url + "/metrics")).text
            found = {}
            for line in text.splitlines():
                name, _, value = line.partition(" ")
                if name in names:
                    found[name] = float(value)
            if len(found) == len(names):
                return {"prompt": found[names[0]], "cached": found[names[1]]}
            await asyncio.sleep(0.5)
        raise RuntimeError(f"{self.server.label}: /metrics has no {names} (engine not answering?)")


def compare(turn: int, on: Reply, off: Reply) -> dict:
    return {"turn": turn, "prompt_tokens": on.prompt_tokens, "cached_tokens": on.cached_tokens,
            "cached_tokens_off": off.cached_tokens, "ttft_on_s": on.ttft, "ttft_off_s": off.ttft,
            "ratio": on.ttft / off.ttft, "same_output": on.output() == off.output(),
            "first_from": [on.first_from, off.first_from], "other_load": [on.other_load, off.other_load],
            "answer": on.content}


async def replay(on: Client, off: Client, system: str, turns: int) -> list[dict]:
    """One agent conversation, each turn sent to the cache-on server, then the same messages to the other."""
    rows = []
    messages = wl.opening(system, wl.first_user())
    for turn in range(1, turns + 1):
        a = await on.timed(messages)
        b = await off.timed(messages)
        rows.append(compare(turn, a, b))
        messages = wl.extend(messages, a.message(), a.tool_calls, wl.follow_up(turn + 1))
    return rows


async def turn_two(on: Client, off: Client, system: str, reps: int, replayed: dict) -> dict:
    """Turn 2 with turn 1 cached vs the same messages on the cache-off server, best of `reps` fresh
    conversations each side; the replay's turn 2 is the first of them."""
    runs = [replayed]
    for k in range(1, reps):
        messages = wl.opening(system, wl.first_user(f"test_nested_lists_{k}"))  # a conversation no entry holds
        one = await on.send(messages)
        messages = wl.extend(messages, one.message(), one.tool_calls, wl.follow_up(2))
        runs.append(compare(2, await on.timed(messages), await off.timed(messages)))
    cached = min(r["ttft_on_s"] for r in runs)
    uncached = min(r["ttft_off_s"] for r in runs)
    return {"runs": runs, "ttft_cached_best_s": cached, "ttft_uncached_best_s": uncached,
            "ratio": cached / uncached, "same_output": all(r["same_output"] for r in runs),
            "prompt_tokens": runs[0]["prompt_tokens"], "cached_tokens": min(r["cached_tokens"] for r in runs)}


async def sessions(on: Client, system: str, n: int, turns: int) -> dict:
    """n agent sessions at once sharing the system prompt, each `turns` turns; the engine's counters around them."""
    before = await on.counters()

    async def session(i: int) -> list[Reply]:
        messages = wl.opening(system, wl.first_user(f"test_session_{i}"))
        out = []
        for turn in range(1, turns + 1):
            r = await on.send(messages)
            out.append(r)
            messages = wl.extend(messages, r.message(), r.tool_calls, wl.follow_up(turn + 1))
        return out

    load = cpu.HostLoad()
    t0 = time.perf_counter()
    done = await asyncio.gather(*(session(i) for i in range(n)))
    wall = time.perf_counter() - t0
    other = load.foreign_cores()
    after = await on.counters()
    received = after["prompt"] - before["prompt"]
    cached = after["cached"] - before["cached"]
    replies = [r for s in done for r in s]
    return {"sessions": n, "turns": turns, "requests": len(replies), "received": received, "cached": cached,
            "computed": received - cached, "ratio": (received - cached) / received if received else math.nan,
            "usage_prompt_tokens": sum(r.prompt_tokens for r in replies),
            "usage_cached_tokens": sum(r.cached_tokens for r in replies), "wall_s": wall, "other_load": other,
            "ttft_p50_by_turn_s": [percentile([s[t].ttft for s in done], 50) for t in range(turns)],
            "ttft_p90_s": percentile([r.ttft for r in replies], 90),
            "misses_by_turn": [sum(1 for s in done if s[t].cached_tokens == 0) for t in range(turns)]}


async def measure_pair(on_server: Server, off_server: Server, opts: Options, eos: list[int], say) -> dict:
    limits = httpx.Limits(max_connections=opts.sessions + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(REQUEST_TIMEOUT, connect=10.0), limits=limits) as http:
        on, off = Client(http, on_server, opts, eos), Client(http, off_server, opts, eos)
        for c in (on, off):  # a short prompt (too short to be cached): the first request's one-off costs
            await c.send([{"role": "user", "content": "Hi"}], tools=False)
        first = wl.opening("", wl.first_user())

        async def count(system: str) -> int:
            return await on.tokens([{**first[0], "content": system}, first[1]])

        lines, first_turn = await fit(count, opts.system_tokens)
        system = wl.system_prompt(lines)
        say(f"  system prompt: {lines} guidelines, first turn {first_turn} tokens; replay of {opts.turns} turns")
        rows = await replay(on, off, system, opts.turns)
        say(f"  turn 2, best of {opts.reps}")
        crit = await turn_two(on, off, system, opts.reps, rows[1])
        say(f"  {opts.sessions} concurrent sessions of {opts.turns} turns")
        shared = wl.system_prompt(lines, tag="cold") if opts.cold_sessions else system
        sess = await sessions(on, shared, opts.sessions, opts.turns)
        health = (await http.get(on_server.base_url + "/health")).json()
    return {"system_lines": lines, "first_turn_tokens": first_turn, "replay": rows, "turn2": crit,
            "concurrent": sess, "prompt_cache": health.get("prompt_cache")}


async def fit(count, target: int) -> tuple[int, int]:
    """Guideline lines whose first turn is the closest to target tokens from below, by bisection."""
    lo, hi = 0, 1
    while await count(wl.system_prompt(hi)) <= target:
        lo, hi = hi, hi * 2
    while lo < hi - 1:
        mid = (lo + hi) // 2
        if await count(wl.system_prompt(mid)) <= target:
            lo = mid
        else:
            hi = mid
    return lo, await count(wl.system_prompt(lo))


def measure(opts: Options, work: Workdir, say=lambda msg: None) -> dict:
    """Every part on each rank count: a cache-on and a cache-off server side by side, stopped after."""
    if opts.turns < 2:
        raise ValueError("--turns must be at least 2 (turn 2 is the criterion)")
    model_path, model_env = resolve_model(opts.model, opts.cache_dir)
    config = json.loads((model_path / "config.json").read_text())
    eos = config.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    res: dict = {"meta": {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": opts.model,
                          "options": {k: str(v) if isinstance(v, Path) else v for k, v in opts.__dict__.items()}},
                 "ranks": {}}
    for ranks in opts.ranks:
        say(f"{ranks} rank(s): starting a cache-on (PROMPT_CACHE_BYTES={opts.cache_bytes}) and a cache-off server")
        servers = []
        try:
            servers.append(start_ours(work, model_env, opts.cache_dir, ranks, PROMPT_CACHE_BYTES=str(opts.cache_bytes)))
            servers.append(start_ours(work, model_env, opts.cache_dir, ranks, PROMPT_CACHE_BYTES="0"))
            res["ranks"][str(ranks)] = asyncio.run(measure_pair(servers[0], servers[1], opts, eos, say))
        finally:
            for s in servers:
                s.stop()
    res["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return res


def markdown(res: dict) -> str:
    out = [f"## Agent replay: prefix cache on vs off, {res['meta']['model']}"]
    rows, notes, same, total = [], [], 0, 0
    for ranks, r in res["ranks"].items():
        for x in r["replay"]:
            total += 1
            same += x["same_output"]
            rows.append([ranks, str(x["turn"]), str(x["prompt_tokens"]), str(x["cached_tokens"]),
                         num(x["ttft_on_s"], ".3f"), num(x["ttft_off_s"], ".3f"), num(x["ratio"], ".3f"),
                         "yes" if x["same_output"] else "**NO**", "/".join(num(v, ".1f") for v in x["other_load"])])
            if "finish" in x["first_from"]:
                notes.append(f"{ranks} rank(s), turn {x['turn']}: no visible output before the finish chunk "
                             f"(TTFT taken at the finish)")
    out.append(table(["ranks", "turn", "prompt tokens", "cached tokens", "TTFT on (s)", "TTFT off (s)", "on/off",
                      "same output", "other load on/off"], rows))
    out.append(f"\nOutputs on vs off: {same}/{total} turns identical (content, tool calls, finish reason, "
               f"token counts){'' if same == total else ' -- MISMATCH'}")
    out += [f"- {n}" for n in notes]

    out.append(f"\n## Turn 2 with turn 1 cached vs nothing cached (best of "
               f"{res['meta']['options']['reps']} each side; target <= {TURN2_TARGET})")
    rows = []
    for ranks, r in res["ranks"].items():
        t = r["turn2"]
        runs = t["runs"]
        rows.append([ranks, str(r["first_turn_tokens"]), str(t["prompt_tokens"]), str(t["cached_tokens"]),
                     num(t["ttft_cached_best_s"], ".3f") + " (" + ", ".join(num(x["ttft_on_s"], ".3f") for x in runs) + ")",
                     num(t["ttft_uncached_best_s"], ".3f") + " (" + ", ".join(num(x["ttft_off_s"], ".3f") for x in runs) + ")",
                     num(t["ratio"], ".3f"), "PASS" if t["ratio"] <= TURN2_TARGET else "MISS",
                     "yes" if t["same_output"] else "**NO**"])
    out.append(table(["ranks", "turn 1 prompt tokens", "turn 2 prompt tokens", "cached tokens",
                      "TTFT cached, best (all) s", "TTFT uncached, best (all) s", "ratio", "target", "same output"],
                     rows))

    opts = res["meta"]["options"]
    out.append(f"\n## {opts['sessions']} concurrent sessions x {opts['turns']} turns sharing the system prompt "
               f"({'cold: a prompt no entry holds' if opts['cold_sessions'] else 'warm: the replay served it before'};"
               f" target computed/received <= {COMPUTED_TARGET})")
    rows = []
    for ranks, r in res["ranks"].items():
        c = r["concurrent"]
        rows.append([ranks, str(c["requests"]), f"{c['received']:.0f}", f"{c['cached']:.0f}", f"{c['computed']:.0f}",
                     num(c["ratio"], ".3f"), "PASS" if c["ratio"] <= COMPUTED_TARGET else "MISS",
                     str(sum(c["misses_by_turn"])), num(c["wall_s"], ".1f"),
                     num(c["ttft_p50_by_turn_s"][0], ".2f") + " / " + num(percentile(c["ttft_p50_by_turn_s"][1:], 50), ".2f"),
                     num(c["other_load"], ".1f")])
    out.append(table(["ranks", "requests", "prompt tokens received", "cached", "computed", "computed/received",
                      "target", "requests with nothing cached", "wall (s)", "TTFT p50 turn 1 / later (s)",
                      "other load"], rows))
    for ranks, r in res["ranks"].items():
        c = r["concurrent"]
        if (c["usage_prompt_tokens"], c["usage_cached_tokens"]) != (c["received"], c["cached"]):
            out.append(f"- {ranks} rank(s): /metrics counted {c['received']:.0f} prompt / {c['cached']:.0f} cached "
                       f"tokens, the responses' usage {c['usage_prompt_tokens']} / {c['usage_cached_tokens']}")
        pc = r.get("prompt_cache") or {}
        out.append(f"- {ranks} rank(s): cache-on server after the run: {pc.get('entries')} entries, "
                   f"{(pc.get('bytes') or 0) / 2**20:.1f} MiB of {(pc.get('budget_bytes') or 0) / 2**20:.0f} MiB")
    return "\n".join(out)


def interrupt(signum, frame):
    # Ours for both signals: asyncio.run() only cancels its task on SIGINT, which a client may absorb.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_replay", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="demo-small (default), demo-tiny (default with --quick) or a local MLX model")
    parser.add_argument("--quick", action="store_true", help="4 turns, 2 repetitions, 4 sessions: a smoke test")
    parser.add_argument("--ranks", default="1,2", help="rank counts to measure, comma-separated (default 1,2)")
    parser.add_argument("--turns", type=int, help="turns per conversation (default 8)")
    parser.add_argument("--reps", type=int, help="turn-2 repetitions each side (default 3)")
    parser.add_argument("--sessions", type=int, help="concurrent sessions (default 8)")
    parser.add_argument("--max-tokens", type=int, default=16, help="tokens per answer")
    parser.add_argument("--system-tokens", type=int, default=3000,
                        help="first turn's prompt size (system prompt, tools, first user message)")
    parser.add_argument("--cache-bytes", type=int, default=-1, help="PROMPT_CACHE_BYTES of the cache-on server")
    parser.add_argument("--cold-sessions", action="store_true",
                        help="the concurrent sessions share a system prompt no earlier request sent")
    parser.add_argument("--quiet-wait", type=float, default=5.0,
                        help="before each timed request wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--quiet-threshold", type=float, default=0.5)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where JSON and PNG go")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (their folder is printed)")
    args = parser.parse_args(argv)

    opts = Options(model=args.model or ("demo-tiny" if args.quick else "demo-small"),
                   ranks=[int(x) for x in args.ranks.split(",")], max_tokens=args.max_tokens,
                   system_tokens=args.system_tokens, cache_bytes=args.cache_bytes, cold_sessions=args.cold_sessions,
                   quiet_wait=args.quiet_wait, quiet_threshold=args.quiet_threshold, cache_dir=args.cache_dir)
    opts = quick(opts) if args.quick else opts
    opts = replace(opts, **{k: v for k in ("turns", "reps", "sessions") if (v := getattr(args, k)) is not None})
    if opts.turns < 2 or opts.reps < 1 or opts.sessions < 1:
        parser.error("--turns must be at least 2 (turn 2 is measured), --reps and --sessions at least 1")

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    work = Workdir()

    def say(msg: str) -> None:
        print(f"[agent-replay {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    say(f"model {opts.model}; logs in {work.root}")
    t0 = time.monotonic()
    try:
        res = measure(opts, work, say)
    except KeyboardInterrupt:
        say(f"interrupted: everything this run started is stopped (logs in {work.root})")
        return 130
    except Exception:
        say(f"failed; logs in {work.root}")
        raise
    res["meta"]["wall_s"] = time.monotonic() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.out / f"{stamp}-agent-{opts.model.rsplit('/', 1)[-1]}{'-quick' if args.quick else ''}.json"
    json_path.write_text(json.dumps(res, indent=1, default=str))
    print(markdown(res))
    png = json_path.with_suffix(".png")
    try:
        from bench import agent_plot

        agent_plot.write(res, png)
        print(f"\nPlot: {shown(png)}")
    except ImportError:
        print("\n(no plot: `pip install matplotlib` or `pip install -e '.[bench]'`)")
    print(f"Results: {shown(json_path)}")
    print(f"Wall time: {res['meta']['wall_s'] / 60:.1f} min")
    work.finish(keep=args.keep_logs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
