"""Start, wait for, stop and hand over the API (one process group per API)."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace

from config import ConfigError
from config.keys import api_keys
from ops.interrupt import deferred
from ops.layout import API_START_TIMEOUT, API_STOP_GRACE, Die, Layout, ceil_seconds, log_size, say, show_log_tail
from ops.pidfile import PidFile, Record, stop_recorded
from ops.procs import (Unreadable, group_alive, group_frozen_for_good, http_status, poll, process_start,
                       signal_group,
                       spawn_group, stop_group)

# A replaced API that still runs this long after its drain deadline got KILL at once (it is frozen).
OVERDUE_KILL_GRACE = 1.0


def format_ms(seconds: float) -> str:
    return f"{seconds:.3f}s"


class ApiCtl:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.settings = layout.settings
        self.pids = PidFile(layout.api_pid)
        self.last = None  # the Popen of the API this command started last
        self.handing: tuple[PidFile, int] | None = None  # (the old API's draining file, its group) mid hand-over

    @property
    def listen(self) -> str:
        """Where the API listens, as its pid file records it."""
        return f"{self.settings.API_HOST}:{self.settings.API_PORT}"

    def health(self) -> str:
        """/health's status code, "000" when nothing answers (as curl says it)."""
        code = http_status(self.layout.api_url + "/health", timeout=1.0)
        return "000" if code is None else str(code)

    def port_problem(self) -> str:
        """Why the API could not listen on API_HOST:API_PORT ("" when it can): something answers there (a
        silent listener counts), or binding fails (an address not of this host, a privileged port)."""
        s, url = self.settings, self.layout.api_url
        taken = (f"something already listens on {url} (not an API started by this launch.sh); stop it or set "
                 "API_HOST/API_PORT")
        host = url.split("//", 1)[1].rsplit(":", 1)[0].strip("[]")
        try:
            socket.create_connection((host, s.API_PORT), timeout=1.0).close()
            return taken
        except OSError:
            pass  # refused, unreachable or silent: binding tells
        with socket.socket(socket.AF_INET6 if ":" in s.API_HOST else socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the API binds
            try:
                probe.bind((s.API_HOST, s.API_PORT))
            except socket.gaierror as exc:
                return f"API_HOST={s.API_HOST!r} does not resolve ({exc.strerror}): set it to an address of this host"
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return taken
                if exc.errno == errno.EADDRNOTAVAIL:
                    return (f"API_HOST={s.API_HOST!r} is not an address of this host: set it to one of its "
                            "addresses, 127.0.0.1, or 0.0.0.0 for all of them")
                return f"cannot listen on {s.API_HOST}:{s.API_PORT}: {exc.strerror or exc}; set API_HOST/API_PORT"
        return ""

    def start(self, *args: str) -> int:
        s = self.settings
        self.layout.prepare_dirs()
        with open(self.layout.api_console_log, "a") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} launch.sh: starting API on "
                      f"{s.API_HOST}:{s.API_PORT} ===\n")
        # Started, known to roll_back and recorded, or not started: an API running with no pid file (one
        # started with --take-over shares the port) would serve on unseen by every later command.
        with deferred():
            popen = spawn_group([sys.executable, "-m", "api", "--log-file", str(self.layout.api_log), *args],
                                self.layout.api_console_log, env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.last = popen
            self.pids.write(popen.pid, listen=self.listen, drain=s.API_DRAIN_TIMEOUT)
        return popen.pid

    def check_config(self) -> None:
        """The checks the API makes as it starts (API_KEYS_FILE readable, with a key), made before anything
        is stopped or started: a setting the API would refuse leaves what runs as it is."""
        try:
            api_keys(self.settings)
        except ConfigError as exc:
            print(f"configuration error: {exc}", file=sys.stderr, flush=True)
            running = self.pids.running()
            keeps = f"; the running API (process group {running}) keeps serving" if running is not None else ""
            raise Die(2, "fix the setting above (in .env or the environment; .env.example describes every "
                         f"variable){keeps}") from None

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
        problem = self.port_problem()
        if problem:
            raise Die(1, problem)

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
        stop_recorded("api", self.pids, self.stop_timeout_of(self.pids.record()), quiet=quiet)

    # -- restart-api: the previous API drains beside the new one -----------------------------

    def stop_draining(self) -> None:
        for path in self.layout.draining_files():
            pids = PidFile(path)
            stop_recorded("previous API", pids, self.stop_timeout_of(pids.record()), quiet=True)

    def drain_of(self, record: Record | None) -> float:
        """The API_DRAIN_TIMEOUT an API drains on: the larger of the one it started with (it drains on that)
        and this command's (a file from an older launch.sh records none)."""
        recorded = record.drain if record is not None and record.drain is not None else 0.0
        return max(recorded, self.settings.API_DRAIN_TIMEOUT)

    def stop_timeout_of(self, record: Record | None) -> int:
        """Seconds from an API's TERM to its KILL: its drain timeout and the stop grace."""
        return ceil_seconds(self.drain_of(record)) + API_STOP_GRACE

    def overdue(self, pids: PidFile, slack: float = 0.0) -> float | None:
        """Seconds a replaced API has run past its drain deadline (its API_DRAIN_TIMEOUT + the stop grace after
        its TERM, + slack); None while it is within it, or was never told to stop."""
        record = pids.record()
        if record is None:
            return None
        since = record.stopping_since
        if since is None:
            if record.handing_over:  # not told to stop: a hand-over under way, or abandoned
                return None
            try:  # a file an older launch.sh renamed (so changed) at its hand-over
                since = pids.path.stat().st_ctime
            except OSError:
                return None
        late = time.time() - since - self.stop_timeout_of(record) - slack
        return late if late > 0 else None

    def reap_drained(self) -> None:
        """Under the lock: drop the files of replaced APIs that have finished draining, KILL one still running
        past its drain deadline (frozen or hung, it would keep taking connections on the shared port), and
        finish a hand-over that an interrupted restart-api left halfway."""
        for ready in self.layout.run_dir.glob("api.ready.*"):
            ready.unlink(missing_ok=True)  # no hand-over runs while we hold the lock: a killed one's
        for path in self.layout.draining_files():
            pids = PidFile(path)
            record, pid, why = pids.judge()
            if pid is None:
                if why and why != "not running":
                    say(f"removing stale pid file {path} ({why})")
                pids.drop(record)
                continue
            if record.handing_over:
                self._finish_hand_over(pids, pid)
                continue
            if group_frozen_for_good(pid):
                say(f"the previous API (process group {pid}), replaced by restart-api, is stopped (SIGSTOP) and "
                    "can never finish draining, yet takes connections on the shared port: killing it")
                if stop_group(pid, OVERDUE_KILL_GRACE):  # its stopped processes get KILL at once
                    pids.drop(record)
                continue
            late = self.overdue(pids)
            if late is not None:
                say(f"the previous API (process group {pid}), replaced by restart-api, still runs {late:.0f}s past "
                    f"its drain deadline (API_DRAIN_TIMEOUT={self.drain_of(record)}s + {API_STOP_GRACE}s): "
                    "hung or frozen; killing it")
                if stop_group(pid, OVERDUE_KILL_GRACE):
                    pids.drop(record)  # else not proven gone: judged again next time

    def _finish_hand_over(self, draining: PidFile, old: int) -> None:
        """A restart-api killed mid hand-over left the old API (group old) serving, not told to stop: it stays
        the API when no new one runs; else it drains as a replaced one."""
        current = self.pids.running()
        if current is None:
            try:
                self._move_back(draining)
            except FileNotFoundError:
                return  # it ended meanwhile (a status removed its file): nothing left to finish
            say(f"an interrupted restart-api left the previous API (process group {old}) serving: it stays the API")
            return
        say(f"an interrupted restart-api left the previous API (process group {old}) serving beside the new one "
            f"(process group {current}): it now finishes its open requests and stops")
        self._retire(draining, old)

    def _retire(self, draining: PidFile, old: int) -> None:
        """Tell the replaced API to drain and stop, and watch that it does (the watcher also ends one that stays
        stopped by SIGSTOP: it can act on no TERM, and would hang the connections the shared port gives it)."""
        draining.mark_stopping()
        signal_group(old, signal.SIGTERM)
        self.watch_drain(draining)

    def _mark_handing_over(self, record: Record, old: int) -> None:
        """Rewrite api.pid, still in place, in the current format with the hand-over marker: once moved aside
        it is a hand-over to finish, never taken for a file an older launch.sh renamed, whatever api.pid held."""
        start = record.start
        if start is None:
            try:
                start = process_start(old)
            except Unreadable:
                pass
        if self.pids.record() == record:  # not dropped meanwhile (a status): never write back a file
            self.pids.save(replace(record, start=start, handover_since=time.time()))

    def _move_back(self, draining: PidFile) -> None:
        """Make the handed-over API the API again (FileNotFoundError when its file is gone), without the marker."""
        draining.move_to(self.pids.path)
        self._unmark()

    def _unmark(self) -> None:
        record = self.pids.record()
        if record is not None and record.handover_since is not None:
            self.pids.save(replace(record, handover_since=None))

    def watch_drain(self, draining: PidFile) -> None:
        """A watcher of its own (ops.drain_watch) KILLs the replaced API if it outlives its drain deadline,
        whether or not another ./launch.sh command runs by then."""
        seconds = self.stop_timeout_of(draining.record())
        spawn_group([sys.executable, "-m", "ops.drain_watch", str(draining.path), str(seconds)],
                    self.layout.api_console_log, env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def hand_over(self, old: int) -> str:
        """Start the new API beside the running one (group old) on the same port (SO_REUSEPORT); once it
        listens, old stops accepting and drains. "ok"; else the new API did not come up and old still
        serves: "port" when the new one could not listen beside old on the very address old listens on
        (old was started without SO_REUSEPORT), "failed" otherwise (its log shown). "gone" when old ended
        before anything began, "none" when it ended while the new one failed (a status removed its file):
        no API runs. An ending signal meanwhile raises as it comes, but never between a step's halves;
        roll_back() then undoes what began."""
        run = self.layout.run_dir
        ready = PidFile(run / f"api.ready.{os.getpid()}")
        t0, offsets = time.monotonic(), self._offsets()
        ready.path.unlink(missing_ok=True)
        old_record = self.pids.record()
        if old_record is None:
            return "gone"
        self.last = None
        self.handing = (PidFile(run / f"api.draining.{old}"), old)
        with deferred():  # a marker half written would leave a temporary file
            self._mark_handing_over(old_record, old)
        try:
            draining = self.pids.move_to(run / f"api.draining.{old}")
        except FileNotFoundError:
            self.handing = None
            return "gone"
        pid = self.start("--take-over", "--ready-file", str(ready.path))
        listening = poll(lambda: ready.read() == pid, API_START_TIMEOUT, 0.1, alive=lambda: group_alive(pid))
        ready.path.unlink(missing_ok=True)
        if not listening:
            port = self._port_refused(offsets, old_record)
            self._failed(offsets)
            try:
                self._move_back(draining)
            except FileNotFoundError:
                self.handing = None
                return "none"
            self.handing = None
            return "port" if port else "failed"
        with deferred():  # told to stop, and watched, or neither: a signal waits for this
            self._retire(draining, old)
            self.handing = None
        say(f"API ready in {format_ms(time.monotonic() - t0)} on {self.layout.api_url} (pid {pid}); the previous API "
            f"(process group {old}) stopped accepting and finishes its open requests within "
            f"API_DRAIN_TIMEOUT={self.drain_of(old_record)}s")
        return "ok"

    def roll_back(self) -> bool:
        """After an ending signal during hand_over: stop the new API and make the old one the API again.
        False when the hand-over was already complete (the new API serves)."""
        if self.handing is None:
            return False
        draining, old = self.handing
        self.handing = None
        self.layout.run_dir.joinpath(f"api.ready.{os.getpid()}").unlink(missing_ok=True)
        if self.last is not None:
            say(f"stopping the new API (process group {self.last.pid})")
            stop_group(self.last.pid, self.layout.api_stop_timeout)
            self.pids.unlink(self.last.pid)
        try:
            self._move_back(draining)
        except FileNotFoundError:
            self._unmark()  # never moved aside (api.pid still names it, marked), or it ended meanwhile
        if self.pids.read() == old:
            say(f"the previous API (process group {old}) keeps serving")
        else:
            say(f"the previous API (process group {old}) ended meanwhile: no API runs; start one with "
                "./launch.sh restart-api")
        return True

    def _port_refused(self, offsets: tuple[int, int], old: Record | None) -> bool:
        """True when the API that just failed exited because its address was in use, and that address is
        the very one the old API listens on: then the old one holds it without SO_REUSEPORT. Any other
        failure to listen (an address not of this host, a privileged port, a new API_PORT another program
        holds) is no reason to stop the old one. An old API whose pid file (an older launch.sh's) does not
        say where it listens predates SO_REUSEPORT: the address in use is taken to be its own."""
        if self.last is None:
            return False
        try:
            code = self.last.wait(1.0)
        except subprocess.TimeoutExpired:  # still running: it did not answer in time
            return False
        try:
            with open(self.layout.api_log, "rb") as f:
                f.seek(offsets[1])
                text = f.read().decode(errors="replace")
        except OSError:
            return False
        if code != 1 or f"cannot listen on {self.listen}: {os.strerror(errno.EADDRINUSE)}" not in text:
            return False
        return old is None or old.listen is None or old.listen == self.listen
