"""`python -m bench.profile`: where a generated token's time goes in our server, under a steady streaming load.

For each rank count (--ranks) and concurrency (--concurrency) it starts our engine + API as bench.run does,
keeps c streaming requests going (greedy, EOS suppressed, like bench.run), and over one window reads every
thread's CPU from /proc (the API, each rank, the launcher) while py-spy samples rank 0 and the API. Prints
Markdown tables; writes the raw profiles and a JSON under bench/results/ (see bench/README.md).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

if __package__ in (None, ""):  # `python bench/profile.py`: the repository, not bench/ (whose profile.py
    sys.path[0] = str(Path(__file__).resolve().parent.parent)  # would stand in for the standard library's)

from bench import clients, cpu, stacks  # noqa: E402
from bench.report import num, table  # noqa: E402
from bench.run import eos_token_ids, prompt, resolve_model  # noqa: E402
from bench.servers import PYTHON, REPO, Server, Workdir, shown, start_ours  # noqa: E402

ATTACH_S = 0.5  # py-spy's time to attach before the window opens
NATIVE_ENGINE = "native (MLX compute / collective)"
SHOWN_CPU_SHARE = 0.005  # threads under this share of one core are pooled into one row per process
THREAD_ORDER = {"MainThread": 0, "engine-socket": 1}  # in the tables, then the others by name


def py_spy() -> str | None:
    local = Path(PYTHON).parent / "py-spy"
    return str(local) if local.is_file() else shutil.which("py-spy")


def generated_tokens(base_url: str) -> float | None:
    """The API's count of generated tokens (/metrics), or None when it cannot be read."""
    try:
        with urllib.request.urlopen(base_url + "/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    m = re.search(r"^mcs_generation_tokens_total\s+(\S+)$", text, re.M)
    return float(m[1]) if m else None


def tokens_between(samples: list[clients.Sample], t0: float, t1: float) -> float:
    """Client-side estimate when /metrics is unavailable: each request's tokens spread over its stream."""
    total = 0.0
    for s in samples:
        if s.first is None or s.last is None or s.last <= s.first:
            continue
        overlap = max(0.0, min(t1, s.last) - max(t0, s.first))
        total += s.tokens * overlap / (s.last - s.first)
    return total


class Spy:
    """py-spy on one process: a sampling profile (`record`, raw collapsed stacks) and its threads' names (`dump`)."""

    def __init__(self, exe: str | None, rate: int):
        self.exe, self.rate = exe, rate

    def dump(self, pid: int) -> tuple[dict[int, tuple[str, str]], str]:
        """(tid -> (name, state), why it is empty)."""
        if self.exe is None:
            return {}, "py-spy is not installed (pip install -e '.[bench]')"
        try:
            out = subprocess.run([self.exe, "dump", "--nonblocking", "--pid", str(pid)], capture_output=True,
                                 text=True, timeout=30)
        except subprocess.TimeoutExpired:
            return {}, "py-spy dump did not answer within 30 s"
        threads = stacks.dump_threads(out.stdout)
        why = first_line(out.stderr or out.stdout) or f"py-spy dump exited {out.returncode}"
        return threads, "" if threads else why

    def record(self, pid: int, out: Path, limit_s: float) -> subprocess.Popen | None:
        if self.exe is None:
            return None
        return subprocess.Popen([self.exe, "record", "-r", str(self.rate), "--threads", "--idle", "-f", "raw",
                                 "-o", str(out), "--nonblocking", "-d", str(math.ceil(limit_s)), "-p", str(pid)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def finish(proc: subprocess.Popen | None, out: Path) -> dict:
        """Stop a recording (SIGINT makes py-spy write its file): {"missing": why} when there is no profile, else
        py-spy's own count of samples and of failed reads (a stack that changed while it was read)."""
        if proc is None:
            return {"missing": "py-spy is not installed (pip install -e '.[bench]')"}
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            err, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            err, _ = proc.communicate()
        if out.is_file() and out.stat().st_size:
            m = re.search(r"Samples: (\d+) Errors: (\d+)", err or "")
            behind = re.findall(r"([\d.]+)s behind in sampling", err or "")
            return {"samples": int(m[1]) if m else None, "read_errors": int(m[2]) if m else None,
                    "behind_s": max((float(x) for x in behind), default=0.0)}
        lines = [ln for ln in (err or "").splitlines() if ln.strip() and not ln.startswith(" ")]
        return {"missing": (lines[0] if lines else f"py-spy record exited {proc.returncode}")[:300]}


def first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def thread_rows(procs: dict[str, int], before: dict[str, dict[int, float]], after: dict[str, dict[int, float]],
                names: dict[str, dict[int, tuple[str, str]]], wall: float, tokens: float) -> list[dict]:
    """CPU of every thread over the window, named from py-spy's dump (tid == pid: the main thread)."""
    rows = []
    for proc, pid in procs.items():
        engine = proc.startswith(("rank", "engine"))
        for tid, t1 in after[proc].items():
            seconds = t1 - before[proc].get(tid, 0.0)
            if tid in names.get(proc, {}):
                name = names[proc][tid][0]
            elif not names.get(proc):  # no dump: only the kernel's view
                name = "main thread" if tid == pid else f"? ({cpu.thread_comm(pid, tid)}; no py-spy names)"
            else:
                name = NATIVE_ENGINE if engine else "native"
            rows.append({"process": proc, "pid": pid, "tid": tid, "thread": name, "cpu_s": seconds,
                         "core_share": seconds / wall if wall else math.nan,
                         "cpu_ms_per_token": 1000 * seconds / tokens if tokens else math.nan})
    return rows


def profile_window(server: Server, spy: Spy, c: int, args, eos: list[int], out_dir: Path, tag: str) -> dict:
    """c closed-loop streaming clients; after --warmup seconds, a --seconds window of /proc and py-spy."""
    bias = {t: -100.0 for t in eos}
    counter = iter(range(10**9))
    stop = threading.Event()
    samples: list[clients.Sample] = []
    load = threading.Thread(target=lambda: samples.extend(clients.steady(
        server.base_url, lambda: clients.chat(prompt(next(counter)), args.max_tokens, bias, "default"), c, stop)),
        daemon=True)
    load.start()
    spies: dict[str, tuple[subprocess.Popen | None, Path]] = {}
    try:
        time.sleep(args.warmup)
        procs = server.processes()
        targets = {p: procs[p] for p in ("engine", "rank 0", "api") if p in procs}
        for proc, pid in targets.items():
            path = out_dir / f"{tag}-{proc.replace(' ', '')}.txt"
            spies[proc] = (spy.record(pid, path, args.seconds + 60), path)
        time.sleep(ATTACH_S)
        spy_cpu0 = {p: cpu.cpu_seconds(s.pid) or 0.0 for p, (s, _) in spies.items() if s is not None}
        before = {p: cpu.thread_seconds(pid) for p, pid in procs.items()}
        tok0, t0, host = generated_tokens(server.base_url), time.perf_counter(), cpu.HostLoad()
        time.sleep(args.seconds)
        after = {p: cpu.thread_seconds(pid) for p, pid in procs.items()}
        tok1, t1 = generated_tokens(server.base_url), time.perf_counter()
        spy_cpu = {p: (cpu.cpu_seconds(s.pid) or 0.0) - spy_cpu0[p] for p, (s, _) in spies.items() if s is not None}
        other = host.foreign_cores()
        recorded = {p: Spy.finish(s, path) for p, (s, path) in spies.items()}
    finally:
        stop.set()
        for s, _ in spies.values():
            if s is not None and s.poll() is None:
                s.kill()
                s.wait()
        load.join(timeout=args.seconds + 600)
    names, dump_errors = {}, {}
    for proc, pid in procs.items():
        names[proc], dump_errors[proc] = spy.dump(pid)
    wall = t1 - t0
    tokens = tok1 - tok0 if tok0 is not None and tok1 is not None else tokens_between(samples, t0, t1)
    result = {"ranks": server.label, "concurrency": c, "window_s": wall, "tokens": tokens,
              "tokens_from": "metrics" if tok0 is not None and tok1 is not None else "client estimate",
              "tokens_per_s": tokens / wall if wall else math.nan, "other_load_cores": other,
              "errors": sum(1 for s in samples if not s.ok), "requests": len(samples),
              "threads": thread_rows(procs, before, after, names, wall, tokens),
              "process_cpu_ms_per_token": {}, "profiles": {},
              "py_spy_cpu_share": {p: v / wall for p, v in spy_cpu.items()},
              "dump_errors": {p: e for p, e in dump_errors.items() if e}}
    for row in result["threads"]:
        result["process_cpu_ms_per_token"][row["process"]] = \
            result["process_cpu_ms_per_token"].get(row["process"], 0.0) + row["cpu_ms_per_token"]
    for proc, (_, path) in spies.items():
        rules = stacks.api_rules if proc == "api" else stacks.engine_rules
        if "missing" in recorded[proc]:
            result["profiles"][proc] = recorded[proc]
            continue
        parsed = stacks.parse_raw(path.read_text(errors="replace"))
        result["profiles"][proc] = {"raw": str(path), "rate": args.rate, **recorded[proc],
                                    "threads": stacks.shares(parsed, rules),
                                    "leaves": stacks.top_leaves(parsed, rules, 15)}
    return result


def markdown(meta: dict, windows: list[dict]) -> str:
    parts = [f"## Where a token's time goes: ours, {meta['model']}{' (quick)' if meta['quick'] else ''}",
             f"{meta['started']}, git {meta['git']}; streaming chat requests, greedy, max_tokens {meta['max_tokens']}, "
             f"EOS suppressed; c closed-loop clients; {meta['seconds']:g} s windows after {meta['warmup']:g} s of "
             "load; "
             f"py-spy at {meta['rate']} Hz on rank 0 and the API (wall-clock samples, waiting included)."]
    for w in windows:
        parts.append(f"### {w['ranks']}, c={w['concurrency']}: {num(w['tokens'], '.0f')} tokens in "
                     f"{w['window_s']:.1f} s ({num(w['tokens_per_s'])} tok/s, from {w['tokens_from']}); "
                     f"other load {w['other_load_cores']:.2f} cores; {w['errors']} errors")
        spy_note = ", ".join(f"{p} {100 * v:.0f} %" for p, v in w["py_spy_cpu_share"].items())
        rows = []
        for proc in sorted(w["process_cpu_ms_per_token"]):
            mine = sorted((r for r in w["threads"] if r["process"] == proc), key=lambda r: -r["cpu_s"])
            small = [r for r in mine if r["core_share"] < SHOWN_CPU_SHARE]
            rows += [[proc, r["thread"], str(r["tid"]), num(r["cpu_ms_per_token"], ".3f"),
                      num(100 * r["core_share"], ".1f")] for r in mine if r["core_share"] >= SHOWN_CPU_SHARE]
            if small:
                rows.append([proc, f"{len(small)} other threads (< {100 * SHOWN_CPU_SHARE:g} % each)", "",
                             num(sum(r["cpu_ms_per_token"] for r in small), ".3f"),
                             num(100 * sum(r["core_share"] for r in small), ".1f")])
            rows.append([proc, "**all threads**", "", f"**{num(w['process_cpu_ms_per_token'][proc], '.3f')}**",
                         f"**{num(100 * sum(r['core_share'] for r in mine), '.1f')}**"])
        parts += [f"CPU by thread over the window (/proc/<pid>/task/<tid>/stat; names from `py-spy dump`); "
                  f"py-spy itself used {spy_note or 'nothing'} of a core:",
                  table(["process", "thread", "tid", "CPU ms / token", "% of one core"], rows)]
        for proc, prof in w["profiles"].items():
            if "missing" in prof:
                parts.append(f"No py-spy profile of {proc}: {prof['missing']}")
                continue
            rows = []
            for thread, d in sorted(prof["threads"].items(), key=lambda kv: (THREAD_ORDER.get(kv[0], 9), kv[0])):
                if all(c in d["waiting"] for c in d["categories"]):
                    continue  # a thread that only waited: nothing to split
                for cat, k in d["categories"].items():
                    ms = 1000 * w["window_s"] * k / d["samples"] / w["tokens"] if w["tokens"] else math.nan
                    label = thread if d["threads"] == 1 else f"{thread} (×{d['threads']})"
                    rows.append([label, cat, num(100 * k / d["samples"], ".1f"), num(ms, ".3f")])
            main = prof["threads"].get("MainThread", {}).get("samples", 0)
            hz = main / (w["window_s"] + ATTACH_S)
            behind = ": py-spy fell behind (a busy host)" if hz < 0.9 * prof["rate"] else ""
            parts += [f"{proc}: each thread's samples by category (`{Path(prof['raw']).name}`; {main} samples per "
                      f"thread, ≈ {hz:.0f} Hz of the {prof['rate']} asked{behind}; {prof['read_errors']} failed "
                      "reads); wall ms per token = share × window / tokens:",
                      table(["thread", "category", "% of its samples", "wall ms / token"], rows)]
            busy = sum(k for _, _, k in prof["leaves"]) or 1
            parts += [f"{proc}: top {len(prof['leaves'])} leaf functions (samples in waiting categories left out):",
                      table(["leaf function", "thread", "samples", "% of these"],
                            [[leaf, thread, str(k), num(100 * k / busy, ".1f")] for leaf, thread, k in prof["leaves"]])]
        if w["dump_errors"]:
            parts.append("Thread names missing for " + "; ".join(f"{p}: {e}" for p, e in w["dump_errors"].items()))
    return "\n\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="demo-small", help="demo-tiny, demo-small, or a local MLX model folder")
    parser.add_argument("--ranks", default="1", help="comma-separated rank counts, e.g. 1,2")
    parser.add_argument("--concurrency", default="1,8", help="comma-separated numbers of concurrent streams")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of each measured window (20; 8 with --quick)")
    parser.add_argument("--warmup", type=float, default=None,
                        help="seconds of load before each window (3; 2 with --quick)")
    parser.add_argument("--quick", action="store_true", help="shorter windows: a first look in a minute or two")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    parser.add_argument("--prefill-tokens-per-step", type=int, default=512, help="our engine's PREFILL_TOKENS_PER_STEP")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results", help="where the run's folder goes")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models",
                        help="where demo models are generated (shared with the tests)")
    parser.add_argument("--keep-logs", action="store_true", help="keep the servers' logs (their folder is printed)")
    args = parser.parse_args(argv)
    args.seconds = args.seconds or (8.0 if args.quick else 20.0)
    args.warmup = args.warmup if args.warmup is not None else (2.0 if args.quick else 3.0)
    try:
        ranks = [int(x) for x in args.ranks.split(",")]
        levels = [int(x) for x in args.concurrency.split(",")]
    except ValueError:
        parser.error("--ranks and --concurrency take comma-separated whole numbers, e.g. 1,2")
    if min(ranks) < 1 or min(levels) < 1:
        parser.error("--ranks and --concurrency must be at least 1")

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupt)
    model_path, model_env = resolve_model(args.model, args.cache_dir)
    eos = eos_token_ids(model_path)
    work = Workdir()
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_dir = args.out / f"{stamp}-profile-{args.model.rsplit('/', 1)[-1]}{'-quick' if args.quick else ''}"
    out_dir.mkdir(parents=True, exist_ok=True)
    spy = Spy(py_spy(), args.rate)
    rev = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=REPO, capture_output=True, text=True).stdout
    meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "model": args.model, "model_path": str(model_path),
            "quick": args.quick, "max_tokens": args.max_tokens, "eos_token_ids": eos, "seconds": args.seconds,
            "warmup": args.warmup, "rate": args.rate, "ranks": ranks, "concurrency": levels, "git": rev.strip(),
            "py_spy": spy.exe}
    say = lambda msg: print(f"[profile {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"model {args.model}; logs in {work.root}; profiles in {out_dir}")
    windows, failures = [], {}
    try:
        for n in ranks:
            try:
                server = start_ours(work, model_env, args.cache_dir, n,
                                    PREFILL_TOKENS_PER_STEP=str(args.prefill_tokens_per_step))
            except RuntimeError as exc:
                failures[f"{n} ranks"] = str(exc)[-2000:]
                say(f"{n} rank(s): did not start: {first_line(str(exc))}")
                continue
            try:
                clients.load(server.base_url, [clients.chat(prompt(10**6 + i), 8, {t: -100.0 for t in eos}, "default")
                                               for i in range(2)], 2)  # warm-up
                for c in levels:
                    say(f"{server.label}, c={c} ...")
                    windows.append(profile_window(server, spy, c, args, eos, out_dir, f"{n}r-c{c}"))
            finally:
                server.stop()
    except KeyboardInterrupt:
        say(f"interrupted (logs in {work.root})")
        return 130
    meta["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    (out_dir / "profile.json").write_text(json.dumps({"meta": meta, "windows": windows, "failures": failures},
                                                     indent=1, default=str))
    print(markdown(meta, windows))
    for k, v in failures.items():
        print(f"\n{k} FAILED: {first_line(v)}")
    print(f"\nProfiles and JSON: {shown(out_dir)}")
    work.finish(keep=args.keep_logs or bool(failures))
    return 0


if __name__ == "__main__":
    sys.exit(main())
