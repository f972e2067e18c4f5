"""Start, wait for, stop and hand over the API (one process group per API)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from ops.layout import API_START_TIMEOUT, Die, Layout, log_size, say, show_log_tail
from ops.pidfile import PidFile, stop_recorded
from ops.procs import group_alive, http_status, poll, signal_group, spawn_group


def format_ms(seconds: float) -> str:
    return f"{seconds:.3f}s"


class ApiCtl:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.settings = layout.settings
        self.pids = PidFile(layout.api_pid)

    def health(self) -> str:
        """/health's status code, "000" when nothing answers (as curl says it)."""
        code = http_status(self.layout.api_url + "/health", timeout=1.0)
        return "000" if code is None else str(code)

    def port_taken(self) -> bool:
        """True unless connecting to the API's address is refused: a silent listener counts."""
        host = self.layout.api_url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
        try:
            socket.create_connection((host, self.settings.API_PORT), timeout=1.0).close()
        except TimeoutError:
            return True
        except OSError:
            return False
        return True

    def start(self, *args: str) -> int:
        s = self.settings
        self.layout.prepare_dirs()
        with open(self.layout.api_console_log, "a") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} launch.sh: starting API on "
                      f"{s.API_HOST}:{s.API_PORT} ===\n")
        popen = spawn_group([sys.executable, "-m", "api", "--log-file", str(self.layout.api_log), *args],
                            self.layout.api_console_log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self.pids.write(popen.pid)
        return popen.pid

    def wait_ready(self, pid: int, want: str) -> bool:
        """Poll /health until it answers want ("200", or "any" answer at all)."""
        last = ["000"]

        def answers() -> bool:
            last[0] = self.health()
            return (last[0] == "200" or (want == "any" and last[0] != "000")) and group_alive(pid)

        if poll(answers, API_START_TIMEOUT, 0.1, alive=lambda: group_alive(pid)):
            return True
        if not group_alive(pid):
            say("the API exited during start-up")
        else:
            say(f"the API did not answer {self.layout.api_url}/health within {API_START_TIMEOUT}s (last status {last[0]})")
        return False

    def refuse_running(self) -> None:
        pid = self.pids.clear_stale()
        if pid is not None:
            raise Die(1, f"the API is already running (process group {pid}); use ./launch.sh status, stop or restart-api")
        if self.port_taken():
            raise Die(1, f"something already listens on {self.layout.api_url} (not an API started by this launch.sh); "
                         "stop it or set API_HOST/API_PORT")

    def _failed(self, offsets: tuple[int, int]) -> None:
        show_log_tail(self.layout.api_console_log, offsets[0])
        show_log_tail(self.layout.api_log, offsets[1])
        self.stop(quiet=True)

    def _offsets(self) -> tuple[int, int]:
        return log_size(self.layout.api_console_log), log_size(self.layout.api_log)

    def launch(self, want: str) -> int | None:
        """Start the API and wait for /health; on failure show the log, stop it and return None."""
        t0, offsets = time.monotonic(), self._offsets()
        pid = self.start()
        if not self.wait_ready(pid, want):
            self._failed(offsets)
            return None
        say(f"API ready in {format_ms(time.monotonic() - t0)} on {self.layout.api_url}")
        return pid

    def stop(self, quiet: bool = False) -> None:
        stop_recorded("api", self.pids, self.layout.api_stop_timeout, quiet=quiet)

    # -- restart-api: the previous API drains beside the new one -----------------------------

    def stop_draining(self) -> None:
        for path in self.layout.draining_files():
            stop_recorded("previous API", PidFile(path), self.layout.api_stop_timeout, quiet=True)

    def forget_drained(self) -> None:
        """Drop the files of replaced APIs that have finished draining."""
        for path in self.layout.draining_files():
            pid = PidFile(path).read()
            if pid is None or not group_alive(pid):
                path.unlink(missing_ok=True)

    def hand_over(self, old: int) -> bool:
        """Start the new API beside the running one (group old) on the same port (SO_REUSEPORT); once it
        listens, old stops accepting and drains. False, with old still serving, when that cannot be done
        (e.g. old was started without SO_REUSEPORT)."""
        run = self.layout.run_dir
        ready = PidFile(run / f"api.ready.{os.getpid()}")
        t0, offsets = time.monotonic(), self._offsets()
        ready.path.unlink(missing_ok=True)
        draining = self.pids.move_to(run / f"api.draining.{old}")
        pid = self.start("--take-over", "--ready-file", str(ready.path))
        listening = poll(lambda: ready.read() == pid, API_START_TIMEOUT, 0.1, alive=lambda: group_alive(pid))
        ready.path.unlink(missing_ok=True)
        if not listening:
            self._failed(offsets)
            draining.move_to(self.pids.path)
            return False
        signal_group(old, signal.SIGTERM)
        say(f"API ready in {format_ms(time.monotonic() - t0)} on {self.layout.api_url} (pid {pid}); the previous API "
            f"(process group {old}) stopped accepting and finishes its open requests within "
            f"API_DRAIN_TIMEOUT={self.settings.API_DRAIN_TIMEOUT}s")
        return True
