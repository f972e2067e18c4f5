"""`python -m bench.run`: measure our server against mlx-lm on this machine, in one run.

Prints Markdown tables, writes bench/results/<timestamp>.json and a PNG plot next to it.
See bench/README.md for what is measured and how to read it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if __package__ in (None, ""):  # `python bench/run.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import ceilings, clients, cpu, report  # noqa: E402
from bench.servers import (  # noqa: E402
    PYTHON,
    REPO,
    Server,
    Workdir,
    run_launched,
    run_local,
    shown,
    start_mlx_lm,
    start_ours,
)

MAX_REPS = 8
# After a request ends, what the engine may still do before it counts as idle (the idle CPU window starts here).
IDLE_SETTLE_S = 2.0
TOPICS = ["the sea", "a red bicycle", "prime numbers", "bread", "the moon", "a lost key", "winter", "jazz",
          "volcanoes", "a small robot", "tea", "old maps", "trains", "owls", "the desert", "clocks"]


@dataclass
class Budget:
    """How much to measure: --quick trades precision for a run of a few minutes."""

    max_tokens: int
    single_runs: int
    ttft_runs: int
    levels_1r: list[int]
    levels_2r: list[int]
    reps_at_8: int  # the level the targets use gets the most runs
    reps_default: int
    reps_at_32: int
    ceiling_repeats: int
    min_seconds: float  # keep repeating a level (up to MAX_REPS) until it has run this long: tiny models
    idle_seconds: float
    idle_cpu_mlx_lm: bool
    idle_ranks: int  # the idle part: ours on this many local ranks
    idle_gap: float  # seconds of nothing before each first request after idle
    idle_rounds: int  # gaps (each one a cold request, and an idle CPU window)
    warm_per_round: int  # requests sent right after the cold one, each as soon as the previous ended

    def reps(self, c: int) -> int:
        return self.reps_at_8 if c == 8 else self.reps_at_32 if c >= 32 else self.reps_default


def budget_for(args) -> Budget:
    if args.quick:
        return Budget(max_tokens=args.max_tokens, single_runs=3, ttft_runs=10, levels_1r=[1, 8, 32], levels_2r=[8],
                      reps_at_8=1, reps_default=1, reps_at_32=1, ceiling_repeats=1, min_seconds=3.0,
                      idle_seconds=10.0, idle_cpu_mlx_lm=False, idle_ranks=4, idle_gap=10.0, idle_rounds=3,
                      warm_per_round=3)
    return Budget(max_tokens=args.max_tokens, single_runs=8, ttft_runs=30, levels_1r=[1, 4, 8, 16, 32],
                  levels_2r=[1, 4, 8, 16, 32], reps_at_8=3, reps_default=2, reps_at_32=1, ceiling_repeats=3,
                  min_seconds=8.0, idle_seconds=10.0, idle_cpu_mlx_lm=True, idle_ranks=4, idle_gap=20.0,
                  idle_rounds=5, warm_per_round=4)


class Bench:
    def __init__(self, args, plan: Budget):
        self.args, self.plan = args, plan
        self.work = Workdir()
        self.model_path, self.model_env = resolve_model(args.model, args.cache_dir)
        self.eos = eos_token_ids(self.model_path)
        self.vocab = int(json.loads((self.model_path / "config.json").read_text()).get("vocab_size", 1000))
        self.bias = {t: -100.0 for t in self.eos}
        self.counter = 0
        self.ours_settings = {"PREFILL_TOKENS_PER_STEP": str(args.prefill_tokens_per_step)}
        self.results: dict = {"meta": self.meta(), "servers": {}, "ceilings": {}}
        self.running: list[Server] = []
        self.quiet_waits = 0.0

    # -- helpers -----------------------------------------------------------------------
    def meta(self) -> dict:
        import importlib.metadata as md

        def version(name: str) -> str:
            try:
                return md.version(name)
            except md.PackageNotFoundError:
                return "?"

        rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True,
                             text=True).stdout.strip()
        return {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": self.args.model,
                "model_path": str(self.model_path), "quick": self.args.quick, "max_tokens": self.plan.max_tokens,
                "eos_token_ids": self.eos, "prefill_tokens_per_step": self.args.prefill_tokens_per_step,
                "host": platform.node(), "machine": platform.machine(), "cpus": os.cpu_count(),
                "python": platform.python_version(), "mlx": version("mlx"), "mlx_lm": version("mlx-lm"),
                "git": rev, "plan": self.plan.__dict__, "quiet_threshold": self.args.quiet_threshold,
                "quiet_wait": self.args.quiet_wait, "idle_settle_s": IDLE_SETTLE_S}

    def prompts(self, n: int) -> list[str]:
        """Short, distinct user messages (distinct so no prompt cache can serve one from another)."""
        out = [prompt(i) for i in range(self.counter, self.counter + n)]
        self.counter += n
        return out

    def chat(self, n: int, model: str | None, max_tokens: int | None = None) -> list[clients.Request]:
        return [clients.chat(p, max_tokens or self.plan.max_tokens, self.bias, model) for p in self.prompts(n)]

    def say(self, msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    def quiet(self) -> float:
        """Wait for a quiet host (bounded by --quiet-wait); returns the seconds waited."""
        waited, load = cpu.wait_quiet(self.args.quiet_threshold, self.args.quiet_wait)
        self.quiet_waits += waited
        if waited > 2.5:
            self.say(f"  waited {waited:.0f} s for other processes to quieten (now {load:.2f} cores)")
        return waited

    def measure(self, fn):
        """fn() on a quiet host, its result tagged with the cores other processes used meanwhile."""
        waited = self.quiet()
        load = cpu.HostLoad()
        out = fn()
        out["other_load_cores"], out["quiet_wait_s"] = load.foreign_cores(), waited
        return out

    def repeat(self, fn, reps: int, load=lambda r: r.other_load, length=lambda r: r.wall) -> list:
        """fn() until reps runs were clean (others used under --quiet-threshold cores meanwhile) and
        min_seconds were spent; at most 2 extra runs for noise, MAX_REPS in all."""
        runs, spent, clean = [], 0.0, 0
        while len(runs) < MAX_REPS:
            if clean >= reps and spent >= self.plan.min_seconds:
                break
            if len(runs) >= reps + 2 and spent >= self.plan.min_seconds:
                break  # the host stays busy: keep what we have, the tables show its load
            r = fn()
            runs.append(r)
            spent += length(r)
            clean += load(r) < self.args.quiet_threshold
        return runs

    def timed_load(self, server: Server, requests: list[clients.Request], c: int) -> clients.LoadResult:
        waited = self.quiet()
        procs = server.processes()
        before = {name: cpu.cpu_seconds(pid) or 0.0 for name, pid in procs.items()}
        load = cpu.HostLoad()
        r = clients.load(server.base_url, requests, c)
        r.other_load, r.quiet_wait = load.foreign_cores(), waited
        r.server_cpu_by_process = {name: (cpu.cpu_seconds(pid) or 0.0) - before[name] for name, pid in procs.items()}
        r.server_cpu = sum(r.server_cpu_by_process.values())
        return r

    def section(self, name: str, fn) -> None:
        """Run one part; a failure is recorded and reported, the other parts still run."""
        t0 = time.monotonic()
        self.say(f"{name} ...")
        try:
            fn()
        except Exception as exc:  # one broken part must not lose the rest of the run
            if INTERRUPTED:
                raise KeyboardInterrupt from None
            self.say(f"{name} FAILED: {exc}")
            self.results.setdefault("failures", {})[name] = str(exc)[-2000:]
        if INTERRUPTED:  # a client may have turned the interrupt into a failed request
            raise KeyboardInterrupt
        self.say(f"{name} done in {time.monotonic() - t0:.0f} s")

    def model_name(self, server: Server) -> str | None:
        return "default" if server.label.startswith("ours") else clients.OMIT

    # -- servers -----------------------------------------------------------------------
    def serve(self, key: str, start, levels: list[int], *, single: bool, idle: bool, extra=None) -> None:
        t0 = time.monotonic()
        server = start()
        self.running.append(server)
        entry = self.results["servers"].setdefault(key, {})
        entry.update(label=server.label, startup_s=time.monotonic() - t0)
        model = self.model_name(server)
        try:
            clients.load(server.base_url, self.chat(2, model, 8), 2)  # warm-up
            if single:
                entry["single"] = clients.combine(self.repeat(lambda: self.timed_load(server, self.chat(1, model), 1),
                                                              self.plan.single_runs))
                entry["ttft"] = clients.combine([self.timed_load(server, self.chat(self.plan.ttft_runs, model, 4), 1)])
            sweep = []
            for c in levels:
                runs = self.repeat(lambda: self.timed_load(server, self.chat(c, model), c), self.plan.reps(c))
                self.say(f"  {server.label}: concurrency {c}: {len(runs)} run(s)")
                sweep.append(clients.combine(runs))
            entry["sweep"] = sweep
            if extra is not None:
                extra(server, entry)
            if idle:
                time.sleep(IDLE_SETTLE_S)
                entry["idle_cpu"] = cpu.idle_cpu(server.processes(), self.plan.idle_seconds)
        finally:
            server.stop()
            self.running.remove(server)

    def idle_wake(self) -> None:
        """Ours on idle_ranks local ranks: each process's CPU while nothing is asked of it, and the time to
        first token of a short request sent after idle_gap seconds of nothing against the same request sent
        right after another one finished."""
        p = self.plan
        t0 = time.monotonic()
        server = start_ours(self.work, self.model_env, self.args.cache_dir, p.idle_ranks, **self.ours_settings)
        self.running.append(server)
        entry = self.results["servers"].setdefault(f"ours_{p.idle_ranks}r", {})
        entry.update(label=server.label, startup_s=time.monotonic() - t0)
        try:
            clients.load(server.base_url, self.chat(2, "default", 8), 2)  # warm-up
            procs = server.processes()
            windows, cold, warm, errors, loads = [], [], [], [], []
            for _ in range(p.idle_rounds):
                # The gap starts as the last request ends; past IDLE_SETTLE_S it is the idle CPU window.
                time.sleep(IDLE_SETTLE_S)
                windows.append(cpu.idle_cpu(procs, p.idle_gap - IDLE_SETTLE_S))
                load = cpu.HostLoad()
                # One closed-loop client: the first request ends the gap, each next one leaves as the one
                # before it ends (warm). A fresh connection for the first, kept-alive ones for the rest.
                r = clients.load(server.base_url, self.chat(1 + p.warm_per_round, "default", 4), 1)
                loads.append(load.foreign_cores())
                errors += r.errors
                samples = sorted(r.samples, key=lambda x: x.sent)
                cold += [x.ttft for x in samples[:1] if x.ok]
                warm += [x.ttft for x in samples[1:] if x.ok]
            entry["idle_cpu"] = {name: sum(w[name] for w in windows) / len(windows) for name in procs}
            entry["idle_cpu_windows"] = windows
            entry["idle_window_s"] = p.idle_gap - IDLE_SETTLE_S
            entry["wake"] = wake_summary(cold, warm, p.idle_gap, errors, max(loads))
        finally:
            server.stop()
            self.running.remove(server)

    def prefill_interference(self, server: Server, entry: dict) -> None:
        """TTFT of a 30-token prompt sent while eight 1000-token prompts prefill, vs theirs."""
        rng = random.Random(3)
        model = self.model_name(server)
        avoid = set(self.eos)

        def tokens(n: int) -> list[int]:
            return [t for t in (rng.randrange(3, self.vocab) for _ in range(n * 2)) if t not in avoid][:n]

        long = [clients.completion(tokens(1000), 8, self.bias, model) for _ in range(8)]
        short = [clients.completion(tokens(30), 8, self.bias, model)]
        delay = 0.25
        self.quiet()
        load = cpu.HostLoad()
        longs, shorts = clients.waves(server.base_url, [(0.0, long), (delay, short)])
        s = shorts[0]
        long_ttft = [x.ttft for x in longs]
        entry["prefill"] = {
            "long_prompts": 8, "long_prompt_tokens": 1000, "short_prompt_tokens": 30, "short_sent_after_s": delay,
            "prefill_tokens_per_step": self.args.prefill_tokens_per_step, "errors": [x.error for x in [*longs, s] if x.error],
            "long_ttft_p50_s": clients.percentile(long_ttft, 50), "long_ttft_max_s": max(long_ttft),
            "short_ttft_s": s.ttft,
            # Valid only if the short prompt arrived while the long ones were still prefilling.
            "short_sent_during_prefill": s.sent < min(x.first or math.inf for x in longs),
            "ratio": s.ttft / clients.percentile(long_ttft, 50),
            "other_load_cores": load.foreign_cores(),
        }

    # -- the run -----------------------------------------------------------------------
    def run(self) -> dict:
        p, m, path = self.plan, self.args.model, self.model_path
        ceil_prompts = json.dumps(self.prompts(8))
        # As many stream_generate runs in all as the HTTP single-stream part makes.
        stream_prompts = json.dumps(self.prompts(math.ceil(p.single_runs / p.ceiling_repeats)))
        ceil = [PYTHON, "-m", "bench.ceilings"]
        common = ["--model", str(path), "--max-tokens", str(p.max_tokens), "--min-seconds", str(p.min_seconds)]

        def ceiling(key, name, launched: bool, cmd):
            def go():
                # One process per repetition, each started on a quiet host: a ceiling measured
                # while someone else's tests run would flatter every ratio against it.
                def once():
                    if launched:
                        return self.measure(lambda: run_launched(self.work, name, 2, cmd, 600)[0])
                    return self.measure(lambda: run_local(self.work, name, cmd, 600)[0])

                results = self.repeat(once, p.ceiling_repeats, load=lambda r: r["other_load_cores"],
                                      length=lambda r: p.min_seconds)
                runs = [dict(r, other_load_cores=res["other_load_cores"]) for res in results for r in res["runs"]]
                res = results[-1]
                if res["mode"] == "stream":
                    merged = ceilings.summarize_stream(runs)
                else:
                    merged = ceilings.summarize_batch(runs, res["sequences"])
                best = max(runs, key=lambda r: r.get("aggregate_tps", r.get("decode_tps", 0.0)))
                merged.update(mode=res["mode"], ranks=res["ranks"], other_load_cores=best["other_load_cores"],
                              other_load_max=max(r["other_load_cores"] for r in runs))
                self.results["ceilings"][key] = merged
            return go

        self.section("1 rank: stream_generate ceiling",
                     ceiling("stream_generate_1r", "ceil-stream", False,
                             ceil + ["stream", "--prompts", stream_prompts] + common))
        # What our engine runs for one request: separates mlx-lm's batching cost from ours.
        self.section("1 rank: BatchGenerator(1) reference",
                     ceiling("batchgen1_1r", "ceil-batch1x1", False,
                             ceil + ["batch", "--prompts", json.dumps(self.prompts(1))] + common))
        self.section("1 rank: BatchGenerator(8) ceiling",
                     ceiling("batchgen_1r", "ceil-batch1", False, ceil + ["batch", "--prompts", ceil_prompts] + common))
        self.section("1 rank: ours", lambda: self.serve(
            "ours_1r", lambda: start_ours(self.work, self.model_env, self.args.cache_dir, 1, **self.ours_settings),
            p.levels_1r, single=True, idle=False, extra=self.prefill_interference))
        self.section("1 rank: mlx_lm.server", lambda: self.serve(
            "mlxlm_1r", lambda: start_mlx_lm(self.work, path, 1), p.levels_1r, single=True, idle=False))
        self.section("2 ranks: BatchGenerator(8) ceiling",
                     ceiling("batchgen_2r", "ceil-batch2", True, ceil + ["batch", "--prompts", ceil_prompts] + common))
        # The same with a PlanChannel.broadcast before every step: lockstep's cost without HTTP.
        self.section("2 ranks: BatchGenerator(8) + per-step plan broadcast",
                     ceiling("batchgen_plan_2r", "ceil-batch2-plan", True,
                             ceil + ["batch", "--prompts", ceil_prompts, "--plan-broadcast"] + common))
        plan_cmd = [PYTHON, "-m", "bench.plan_cost", "--calls", "2000", "--buffer-bytes", "4096"]
        self.section("2 ranks: plan broadcast cost", lambda: self.results.__setitem__(
            "plan_cost", self.measure(lambda: run_launched(self.work, "plan-cost", 2, plan_cmd, 300)[0])))
        self.section("2 ranks: stream_generate ceiling",
                     ceiling("stream_generate_2r", "ceil-stream2", True,
                             ceil + ["stream", "--prompts", stream_prompts] + common))
        self.section("2 ranks: ours", lambda: self.serve(
            "ours_2r", lambda: start_ours(self.work, self.model_env, self.args.cache_dir, 2, **self.ours_settings),
            p.levels_2r, single=True, idle=True))
        self.section("2 ranks: mlx_lm.server (stdin pipe)", lambda: self.serve(
            "mlxlm_2r_pipe", lambda: start_mlx_lm(self.work, path, 2, stdin_fix=True), p.levels_2r,
            single=False, idle=p.idle_cpu_mlx_lm))
        self.section("2 ranks: mlx_lm.server (plain)", lambda: self.serve(
            "mlxlm_2r_plain", lambda: start_mlx_lm(self.work, path, 2, stdin_fix=False), [8],
            single=False, idle=p.idle_cpu_mlx_lm))
        self.section(f"{p.idle_ranks} ranks: ours idle, and the first token after idle", self.idle_wake)
        self.results["meta"]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
        self.results["meta"]["quiet_wait_s"] = self.quiet_waits
        self.results["meta"]["model"] = m
        return self.results

    def stop_all(self) -> None:
        for s in list(self.running):
            s.stop()


INTERRUPTED = False


def wake_summary(cold: list[float], warm: list[float], gap: float, errors: list[str], other_load: float) -> dict:
    """TTFT after an idle gap against warm TTFT (seconds in, medians and bests out, differences in ms)."""
    def best(xs: list[float]) -> float:
        return min(xs, default=math.nan)

    cold_p50, warm_p50 = clients.percentile(cold, 50), clients.percentile(warm, 50)
    return {"gap_s": gap, "cold_ttft_s": cold, "warm_ttft_s": warm, "cold_p50_s": cold_p50, "warm_p50_s": warm_p50,
            "cold_best_s": best(cold), "warm_best_s": best(warm), "diff_p50_ms": 1000 * (cold_p50 - warm_p50),
            "diff_best_ms": 1000 * (best(cold) - best(warm)), "errors": errors[:3], "error_count": len(errors),
            "other_load_cores": other_load}


def interrupt(signum, frame):
    global INTERRUPTED
    INTERRUPTED = True
    raise KeyboardInterrupt


def eos_token_ids(model_path: Path) -> list[int]:
    """The model's EOS ids (config.json's eos_token_id): the benchmarks suppress them with logit_bias."""
    eos = json.loads((model_path / "config.json").read_text()).get("eos_token_id")
    return [eos] if isinstance(eos, int) else list(eos or [])


def prompt(i: int) -> str:
    """The i-th short user message; distinct ones, so no prompt cache can serve one from another."""
    return f"Note {i}: write a few lines about {TOPICS[i % len(TOPICS)]}."


def resolve_model(name: str, cache_dir: Path) -> tuple[Path, str]:
    """(model folder, MODEL value for our engine); a demo model is generated when missing."""
    if name.startswith("demo-"):
        out = subprocess.run([PYTHON, "-m", "engine.demo", "--size", name[5:], "--cache-dir", str(cache_dir)],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"cannot generate {name}: {out.stderr}")
        return Path(out.stdout.strip().splitlines()[-1]).resolve(), name
    path = Path(name).expanduser().resolve()
    if (path / "config.json").is_file():
        return path, str(path)
    # any other MODEL the engine takes (smollm2-135m, a zoo name, a cached repo id): resolved (and converted or
    # generated once) as the engine resolves it, and handed to our engine by that name
    from config import load_settings
    from engine.model import resolve

    try:
        return resolve(load_settings({"MODEL": name, "MODEL_CACHE_DIR": str(cache_dir)}, env_file=os.devnull)), name
    except Exception as exc:  # noqa: BLE001 - any reason it cannot be served ends the run with it
        raise SystemExit(f"--model {name}: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-tiny", help="demo-tiny, demo-small, smollm2-135m, any MODEL the engine takes, or a local MLX model folder")
    parser.add_argument("--quick", action="store_true", help="fewer requests and concurrency levels (a few minutes)")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where JSON and PNG go")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models",
                        help="where demo models are generated (shared with the tests)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--prefill-tokens-per-step", type=int, default=512, help="our engine's PREFILL_TOKENS_PER_STEP")
    parser.add_argument("--quiet-wait", type=float, default=20.0,
                        help="before each measurement wait up to this many seconds for other processes to go quiet")
    parser.add_argument("--quiet-threshold", type=float, default=0.5,
                        help="cores other processes may use for the host to count as quiet")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (their folder is printed)")
    args = parser.parse_args(argv)

    # Our own handler for both signals: asyncio.run() installs its own SIGINT handler only over
    # the default one, and that one merely cancels the task, which a client may absorb.
    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, interrupt)
    bench = Bench(args, budget_for(args))
    bench.say(f"model {args.model} at {bench.model_path}; logs in {bench.work.root}")
    t0 = time.monotonic()
    try:
        results = bench.run()
    except KeyboardInterrupt:
        bench.say(f"interrupted: stopping everything this run started (logs in {bench.work.root})")
        return 130
    finally:
        bench.stop_all()
    results["meta"]["wall_s"] = time.monotonic() - t0
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    json_path = args.out / f"{stamp}-{args.model.rsplit('/', 1)[-1]}{'-quick' if args.quick else ''}.json"
    json_path.write_text(json.dumps(results, indent=1, default=str))
    print(report.markdown(results))
    png = json_path.with_suffix(".png")
    try:
        from bench import plot

        plot.write(results, png)
        print(f"\nPlot: {shown(png)}")
    except ImportError:
        print("\n(no plot: `pip install matplotlib` or `pip install -e '.[bench]'`)")
    print(f"Results: {shown(json_path)}")
    bench.work.finish(keep=args.keep_logs or bool(results.get("failures")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
