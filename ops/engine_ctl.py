"""Start, wait for and stop the engine: every rank, under ops.supervisor, in one process group."""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path

from config import REPO_ROOT
from config.hub_cache import locate, split_model
from config.model_folder import folder_problem
from ops.interrupt import deferred
from ops.cluster import rank_count
from ops.layout import Die, Layout, ceil_seconds, log_size, say, show_log_tail
from ops.parallel_check import parallel_refusal
from ops.helpers_check import helper_refusal
from ops.kvquant_check import kv_quant_refusal
from ops.speculative_check import speculative_refusal
from ops.pidfile import PidFile, stop_recorded
from ops.probe import drop_stale_socket, engine_info
from ops.rank_env import env_args
from ops.procs import group_alive, poll, process_alive, spawn_group
from ops.state import read_state, state_path

PROBE_TIMEOUT = 2.0  # seconds per readiness probe of engine rank 0
PROGRESS_EVERY = 15.0  # seconds between "still loading" lines
LOCAL = ("127.0.0.1", "localhost", "::1")


def _taken(host: str, port: int) -> str | None:
    """Why port cannot be listened on here (None: it can)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed run's TIME_WAIT is fine
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


class EngineCtl:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.settings = layout.settings
        self.pids = PidFile(layout.engine_pid)
        self.stopped_at = layout.run_dir / "engine.stopped-at"
        self.failed = ""  # why the last launch() failed, in one sentence (a switch rolls back with it)

    def info(self):
        """Rank 0's Info, or None when it does not answer."""
        return engine_info(self.settings.socket_path, PROBE_TIMEOUT)

    def needs_launcher(self) -> bool:
        """mlx.launch, unless a single local rank can run directly."""
        s = self.settings
        return bool(s.HOSTFILE) or s.ranks > 1 or s.hosts[0] not in LOCAL

    def command(self) -> list[str]:
        s = self.settings
        py = sys.executable
        if not self.needs_launcher():
            return [py, "-m", "engine"]
        cmd = [str(Path(py).parent / "mlx.launch"), "--backend", s.BACKEND, "--starting-port", str(s.RING_PORT),
               "--cwd", str(REPO_ROOT)]
        cmd += ["--hostfile", s.HOSTFILE] if s.HOSTFILE else ["--hosts", s.HOSTS]
        # remote ranks do not inherit our environment: settings, HF_* and MLX_* set in it go with them
        return [*cmd, *env_args(s), "--", py, "-m", "engine"]

    def start(self) -> int:
        s = self.settings
        self.layout.prepare_dirs()
        self.cooldown()
        with open(self.layout.engine_log, "a") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} launch.sh: starting engine: model {s.MODEL}, "
                      f"hosts {s.HOSTFILE or s.HOSTS}, backend {s.BACKEND} ===\n")
        # The supervisor leads the engine's process group: it ends every rank when one dies or
        # freezes, records which in engine.state.json, restarts the engine when ENGINE_RESTART=always,
        # and gives mlx.launch the open, silent stdin that keeps it from spinning a core.
        with deferred():  # started and recorded, or neither: a start undone by a signal must find it
            popen = spawn_group([sys.executable, "-m", "ops.supervisor", "--", *self.command()],
                                self.layout.engine_log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.pids.write(popen.pid)
        return popen.pid

    def wait_ready(self, pid: int) -> bool:
        s = self.settings
        limit = ceil_seconds(s.ENGINE_START_TIMEOUT)
        started = time.monotonic()
        next_note = [started + PROGRESS_EVERY]
        say(f"waiting for engine rank 0 on {s.socket_path} (up to {limit}s; loading {s.MODEL})")

        def answers() -> bool:
            if time.monotonic() >= next_note[0]:
                say(f"  still loading ({time.monotonic() - started:.0f}s; ./launch.sh logs engine shows progress)")
                next_note[0] += PROGRESS_EVERY
            return self.info() is not None

        if poll(answers, limit, 0.5, alive=lambda: group_alive(pid)):
            say(f"engine ready after {time.monotonic() - started:.0f}s")
            return True
        if not group_alive(pid):
            self.failed = "the engine exited during start-up"
        else:
            self.failed = f"engine rank 0 did not answer within {limit}s (ENGINE_START_TIMEOUT)"
        say(self.failed)
        return False

    def refuse_taken_ring_ports(self) -> None:
        """Local ranks on the ring listen on RING_PORT, RING_PORT+1, ..., and rank 0's doorbell on RING_PORT-1:
        a port in use would fail the start after a timeout with "[ring] connection to a peer was lost", which
        names no port."""
        s = self.settings
        if s.BACKEND != "ring" or s.HOSTFILE or s.ranks < 2 or not all(h in LOCAL for h in s.hosts):
            return
        for port in range(s.RING_PORT, s.RING_PORT + s.ranks):
            if (why := _taken("127.0.0.1", port)) is not None:
                raise Die(1, f"port {port} is in use on this host ({why}), and the ring's {s.ranks} local ranks "
                             f"need ports {s.RING_PORT} to {s.RING_PORT + s.ranks - 1}: set RING_PORT to a free "
                             "range, or stop what uses it")
        if (why := _taken("", s.doorbell_port)) is not None:
            raise Die(1, f"port {s.doorbell_port} is in use on this host ({why}), and rank 0's doorbell listens on "
                         "it (RING_PORT-1): set RING_PORT to a free range, or stop what uses it")

    def launch(self) -> int | None:
        """Start the engine and wait for rank 0; on failure show the log, stop it and return None."""
        self.refuse_taken_ring_ports()
        self.refuse_broken_model()
        if (why := parallel_refusal(self.settings, rank_count(self.settings))) is not None:
            raise Die(1, why)
        if (why := speculative_refusal(self.settings)) is not None:
            raise Die(1, why)
        if (why := kv_quant_refusal(self.settings)) is not None:
            raise Die(1, why)
        if (why := helper_refusal(self.settings)) is not None:
            raise Die(1, why)
        offset = log_size(self.layout.engine_log)
        pid = self.start()
        if self.wait_ready(pid):
            return pid
        show_log_tail(self.layout.engine_log, offset)
        self.stop(quiet=True)
        self.say_why(pid)
        return None

    def refuse_broken_model(self) -> None:
        """A model folder whose files show it cannot load is refused before any rank starts, in the words
        every rank would log; so is a repo id a local rank's cache lacks (ranks never download it)."""
        model = self.settings.MODEL
        if (parsed := split_model(model)) is not None:
            self.refuse_uncached(model, parsed)
            return
        if not model.startswith(("/", ".", "~")):
            return
        path = Path(model).expanduser()
        if (problem := folder_problem(path if path.is_absolute() else REPO_ROOT / path)) is not None:
            raise Die(1, problem)

    def refuse_uncached(self, model: str, parsed: tuple[str, str]) -> None:
        """The local ranks' caches (remote ones answer in `check`, and each rank at load, in these words)."""
        s = self.settings
        local = [rank for rank, host in enumerate(s.hosts) if host in LOCAL] if not s.HOSTFILE else []
        for rank in local:
            snapshot, why = locate(s.hub_cache(rank), *parsed)
            if snapshot is None:
                raise Die(1, f"MODEL={model!r} cannot be loaded on this host (rank {rank}): {why}; run "
                             f"./launch.sh download {model} (it fetches the model once and copies it to every host)")

    def say_why(self, pid: int) -> None:
        """The supervisor's verdict on the failed start (its typed record), last, so the reason is not left in the
        log above; kept in self.failed."""
        state = read_state(state_path(self.settings.run_dir), pid)
        failure = state.last_failure if state is not None else None
        if failure is not None:
            self.failed = failure.summary + (f": {failure.detail}" if failure.detail else "")
            say(f"the engine did not start: {self.failed}")
            if failure.hint:
                say(failure.hint)

    def stop(self, quiet: bool = False) -> None:
        was_running = self.pids.running() is not None
        stop_recorded("engine", self.pids, self.layout.engine_stop_timeout, quiet=quiet)
        if was_running and self.settings.BACKEND == "jaccl":
            self.stopped_at.write_text(f"{int(time.time())}\n")
        # Killed engines cannot unlink their socket; one something still accepts on is not ours to remove.
        if self.settings.socket_path.is_socket() and not drop_stale_socket(self.settings.socket_path):
            say(f"note: something not started by this launch.sh listens on {self.settings.socket_path}; left alone")

    def refuse_unsupervised(self) -> None:
        """The group runs but its supervisor (the leader) is gone: only restart-engine (or stop) puts that right."""
        pid = self.pids.running()
        if pid is not None and not process_alive(pid):
            raise Die(1, f"the engine runs without its supervisor (pid {pid} is gone): run ./launch.sh "
                         "restart-engine to restart it under supervision")

    def refuse_running(self) -> None:
        pid = self.pids.clear_stale()
        if pid is not None:
            raise Die(1, f"the engine is already running (process group {pid}); use ./launch.sh status, stop or restart")
        if self.info() is not None:
            raise Die(1, f"another engine is already serving on {self.settings.socket_path} (not started by this "
                         "launch.sh); stop it or set SOCKET_PATH")

    def cooldown(self) -> None:
        """jaccl: the RDMA driver releases the old ranks' queue pairs and registered memory only after they exit;
        new ranks must not open the devices sooner (JACCL_COOLDOWN seconds after the last stop)."""
        if self.settings.BACKEND != "jaccl":
            return
        try:
            at = int(self.stopped_at.read_text().strip())
        except (OSError, ValueError):
            return
        wait = at + self.settings.JACCL_COOLDOWN - time.time()
        if wait > 0:
            say(f"jaccl: waiting {wait:.0f}s for the RDMA devices of the stopped ranks to be released (JACCL_COOLDOWN="
                f"{self.settings.JACCL_COOLDOWN:g})")
            time.sleep(wait)
