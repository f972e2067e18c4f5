"""Start and stop what the benchmark measures: our engine + API, and mlx_lm.server, on 1 or N ranks.

Every process starts in its own session and is stopped through its process group (mlx.launch
can orphan its ranks on a plain TERM). Every wait is bounded. Several ranks always go through
`mlx.launch --backend ring` on loopback, as the product starts them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from ops.procs import Group, free_port, free_port_run, free_ring_port, http_status, poll

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
MLX_LAUNCH = str(Path(PYTHON).parent / "mlx.launch")
# Every rank points its fd 0 at /dev/null before running the command: with the launcher's
# stdin an open, silent pipe, one byte then makes each forwarding thread hit EPIPE and stop
# spinning (the workaround described in docs/operations.md).
DETACH_STDIN = ["bash", "-c", 'exec 0</dev/null; exec "$@"', "detach"]
# A process group of one server under test: stop() ends all of it.
Proc = Group


def launch_cmd(ranks: int, port: int, command: list[str]) -> list[str]:
    hosts = ",".join(["127.0.0.1"] * ranks)
    return [MLX_LAUNCH, "--hosts", hosts, "--backend", "ring", "--starting-port", str(port),
            "--cwd", str(REPO), "--", *command]


def spawn(name: str, cmd: list[str], log: Path, env: dict, *, stdin_pipe: bool = False) -> Proc:
    return Group.spawn(cmd, log, name=name, stdin_pipe=stdin_pipe, env=env, cwd=REPO)


def wait_http_ok(procs: list[Proc], url: str, timeout: float) -> None:
    """Poll url until it answers 200; fail fast when one of procs exits."""
    if poll(lambda: http_status(url) == 200, timeout, 0.2, alive=lambda: all(p.alive() for p in procs)):
        return
    for p in procs:
        if not p.alive():
            raise RuntimeError(f"{p.name} exited with {p.popen.returncode} before serving:\n{p.log_tail()}")
    raise RuntimeError(f"{url} did not answer 200 within {timeout:.0f} s:\n"
                       + "\n".join(f"--- {p.name}\n{p.log_tail()}" for p in procs))


def wait_log_lines(proc: Proc, pattern: str, count: int, timeout: float) -> None:
    """Wait until proc's log holds count lines matching pattern (e.g. one per rank)."""
    rx = re.compile(pattern)

    def enough() -> bool:
        try:
            text = proc.log.read_text(errors="replace")
        except OSError:
            text = ""
        return sum(1 for line in text.splitlines() if rx.search(line)) >= count

    if poll(enough, timeout, alive=proc.alive):
        return
    if not proc.alive():
        raise RuntimeError(f"{proc.name} exited with {proc.popen.returncode}:\n{proc.log_tail()}")
    raise RuntimeError(f"{proc.name}: {count} lines matching {pattern!r} did not appear in {timeout:.0f} s:\n"
                       f"{proc.log_tail()}")


@dataclass
class Server:
    """One running HTTP server under test and the process groups behind it."""

    label: str
    base_url: str
    procs: list[Proc]
    launcher: Proc | None = None  # the mlx.launch process when ranks > 1

    def stop(self) -> None:
        for p in self.procs:
            p.stop()

    def processes(self) -> dict[str, int]:
        """Every process of this server by role: `mlx.launch`, `rank N`, `engine`, `api`, `mlx_lm.server`."""
        from bench.cpu import children

        out = {}
        for p in self.procs:
            if p is self.launcher:
                out["mlx.launch"] = p.pid
                for child in children(p.pid):
                    out[f"rank {rank_of(child)}"] = child
            else:
                out[p.name] = p.pid
        return out


def rank_of(pid: int) -> str:
    """MLX_RANK from a process's environment (mlx.launch sets it for each rank)."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return "?"
    for kv in env:
        if kv.startswith(b"MLX_RANK="):
            return kv.split(b"=", 1)[1].decode()
    return "?"


@dataclass
class Workdir:
    """Short temp folders for sockets, logs and run files; kept when asked (for debugging)."""

    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="mcs-bench-", dir="/tmp")))

    def log(self, name: str) -> Path:
        return self.root / f"{name}-{time.strftime('%H%M%S')}.log"

    def finish(self, keep: bool) -> None:
        """At the end of a run: print where the logs are when kept, else remove them."""
        if keep:
            print(f"Logs: {self.root}")
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def shown(path: Path) -> Path:
    """A path as printed: relative to the repository when inside it."""
    return path.relative_to(REPO) if path.is_relative_to(REPO) else path


def save(out: Path, name: str, doc) -> Path:
    """A run's results as out/<time>-<name>.json, said where on stdout."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}.json"
    path.write_text(json.dumps(doc, indent=1))
    print(f"\nResults: {shown(path)}")
    return path


def start_ours(work: Workdir, model: str, cache_dir: Path, ranks: int, timeout: float = 300.0,
               **settings: str) -> Server:
    """Our engine (1 rank directly, N ranks through mlx.launch) and our API, ready when /health is 200."""
    api_port = free_port()
    ring_port = free_ring_port(ranks)
    tag = f"ours-{ranks}r-{api_port}"
    env_file = work.root / "empty.env"
    env_file.touch()
    env = dict(os.environ)
    env.update(
        ENV_FILE=str(env_file),
        RUN_DIR=str(work.root / tag / "run"),
        LOG_DIR=str(work.root / tag / "logs"),
        SOCKET_PATH=str(work.root / f"{api_port}.sock"),
        MODEL=model,
        MODEL_CACHE_DIR=str(cache_dir),
        # each server's own disk tier: a measurement never restores what an earlier run computed
        PROMPT_CACHE_DIR=str(work.root / tag / "prompt-cache"),
        API_HOST="127.0.0.1",
        API_PORT=str(api_port),
        RING_PORT=str(ring_port),
        HOSTS=",".join(["127.0.0.1"] * ranks),
        BACKEND="ring",
        LOG_LEVEL="WARNING",
    )
    env.update(settings)
    if ranks == 1:
        engine = spawn("engine", [PYTHON, "-m", "engine"], work.log(tag + "-engine"), env)
    else:
        # The engine points its own stdin at /dev/null first thing (engine/__main__.py).
        engine = spawn("engine", launch_cmd(ranks, ring_port, [PYTHON, "-m", "engine"]),
                       work.log(tag + "-engine"), env, stdin_pipe=True)
    api = spawn("api", [PYTHON, "-m", "api"], work.log(tag + "-api"), env)
    server = Server(f"ours {ranks} rank{'s' if ranks > 1 else ''}", f"http://127.0.0.1:{api_port}",
                    [api, engine], engine if ranks > 1 else None)
    try:
        wait_http_ok([engine, api], server.base_url + "/health", timeout)
    except BaseException:
        server.stop()
        raise
    engine.release_stdin()
    return server


def start_mlx_lm(work: Workdir, model_path: Path, ranks: int, *, stdin_fix: bool = True,
                 timeout: float = 300.0) -> Server:
    """mlx_lm.server; with ranks > 1 through mlx.launch, with or without the stdin workaround."""
    port = free_port()
    cmd = [PYTHON, "-m", "mlx_lm.server", "--model", str(model_path), "--port", str(port), "--host", "127.0.0.1"]
    env = dict(os.environ)
    tag = f"mlxlm-{ranks}r-{'pipe' if stdin_fix else 'plain'}-{port}"
    if ranks == 1:
        proc = spawn("mlx_lm.server", cmd, work.log(tag), env)
        launcher = None
        label = "mlx_lm.server 1 rank"
    else:
        ring_port = free_port_run(ranks)
        full = launch_cmd(ranks, ring_port, DETACH_STDIN + cmd if stdin_fix else cmd)
        proc = spawn("mlx_lm.server", full, work.log(tag), env, stdin_pipe=stdin_fix)
        launcher = proc
        label = f"mlx_lm.server {ranks} ranks ({'stdin pipe' if stdin_fix else 'plain'})"
    server = Server(label, f"http://127.0.0.1:{port}", [proc], launcher)
    try:
        wait_http_ok([proc], server.base_url + "/health", timeout)
    except BaseException:
        server.stop()
        raise
    proc.release_stdin()
    return server


def wait_done(proc, name: str, timeout: float) -> None:
    """Wait for a measurement script to exit; one still running after `timeout` is an error with its log."""
    try:
        proc.popen.wait(timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{name} did not finish within {timeout:.0f} s:\n{proc.log_tail()}") from None


def bench_results(log) -> list[dict]:
    """The JSON a measurement script printed after `BENCH-RESULT `, one result a line (any rank's)."""
    return [json.loads(line.split("BENCH-RESULT ", 1)[1])
            for line in log.read_text(errors="replace").splitlines() if "BENCH-RESULT " in line]


def run_launched(work: Workdir, name: str, ranks: int, command: list[str], timeout: float,
                 env_extra: dict | None = None) -> list[dict]:
    """Run a short measurement script under mlx.launch (stdin workaround applied) and collect the
    JSON lines it prints after `BENCH-RESULT `. The script prints `BENCH-DETACHED` once per rank."""
    env = dict(os.environ)
    env.update(env_extra or {})
    log = work.log(name)
    proc = spawn(name, launch_cmd(ranks, free_port_run(ranks), command), log, env, stdin_pipe=True)
    try:
        wait_log_lines(proc, r"BENCH-DETACHED", ranks, min(timeout, 120.0))
        proc.release_stdin()
        wait_done(proc, name, timeout)
    finally:
        proc.stop()
    results = bench_results(log)
    if not results:
        raise RuntimeError(f"{name} printed no result:\n{proc.log_tail()}")
    return results


def run_local(work: Workdir, name: str, command: list[str], timeout: float) -> list[dict]:
    """Run a measurement script in its own process (not under mlx.launch) and collect its results."""
    log = work.log(name)
    proc = spawn(name, command, log, dict(os.environ))
    try:
        wait_done(proc, name, timeout)
    finally:
        proc.stop()
    results = bench_results(log)
    if not results or proc.popen.returncode != 0:
        raise RuntimeError(f"{name} failed (exit {proc.popen.returncode}):\n{proc.log_tail()}")
    return results
