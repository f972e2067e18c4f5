"""The commands that change what runs: start, stop, restart, restart-api, restart-engine, logs.

The engine starts first and stops first: it lets in-flight requests finish for DRAIN_TIMEOUT and
ends the rest with an error the API still relays; then the API has nothing left to cut.
"""

from __future__ import annotations

import contextlib
import os

from ops.api_ctl import ApiCtl
from ops.engine_ctl import EngineCtl
from ops.interrupt import Interrupted, held, interruptible, noted
from ops.layout import Die, Layout, say, writable_dir
from ops.pidfile import Busy, Lock


class Services:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.engine = EngineCtl(layout)
        self.api = ApiCtl(layout)

    @contextlib.contextmanager
    def locked(self):
        """A lock for the commands that change state, so two of them never interleave."""
        self.layout.prepare_dirs()
        lock = Lock(self.layout.run_dir / "launch.lock")
        try:
            lock.acquire()
        except Busy as busy:
            who = f" (pid {busy.pid})" if busy.pid is not None else ""
            # An flock proves its holder lives: removing the file would only let a second launch.sh in.
            hint = "" if busy.flocked else f" (if no ./launch.sh runs, remove {lock.path})"
            raise Die(1, f"another ./launch.sh{who} is changing the services; try again when it "
                         f"is done{hint}") from None
        except OSError as exc:
            raise Die(1, f"cannot create the lock {lock.path}: {exc}") from None
        try:
            self.api.reap_drained()
            yield
        finally:
            lock.release()

    # -- start -------------------------------------------------------------------------------

    def start(self) -> int:
        with self.locked():
            self.engine.refuse_unsupervised()
            engine_pid, api_pid = self.engine.pids.running(), self.api.pids.running()
            if engine_pid is not None and api_pid is not None:
                raise Die(1, f"already running (engine process group {engine_pid}, API process group {api_pid}); "
                             "use ./launch.sh status, stop or restart")
            if api_pid is None:
                self.api.check_config()
            started: list = []
            with interruptible():
                try:
                    return self._start(engine_pid, api_pid, started)
                except Interrupted:
                    say("interrupted: stopping what this start began")
                    for stop in reversed(started):
                        stop()
                    return 130

    def _start(self, engine_pid: int | None, api_pid: int | None, started: list) -> int:
        if api_pid is not None:
            # Only the engine is missing (it failed, or was stopped): start it under the running API.
            say(f"the API is already running (process group {api_pid}); starting the engine")
            self.engine.refuse_running()
            started.append(self.engine.stop)
            if (engine_pid := self.engine.launch()) is None:
                return 1
            if not self.api.wait_ready(api_pid, "200"):
                return 1
        elif engine_pid is not None:
            # Only the API is missing: start it in front of the running engine.
            say(f"the engine is already running (process group {engine_pid}); starting the API")
            self.api.refuse_running()
            if self.engine.info() is None:
                raise Die(1, f"the engine (process group {engine_pid}) is not answering on "
                             f"{self.layout.settings.socket_path} yet; see ./launch.sh status, then ./launch.sh restart-api")
            started.append(self.api.stop)
            if (api_pid := self.api.launch("200")) is None:
                return 1
        else:
            self.api.refuse_running()
            self.engine.refuse_running()
            started.append(self.engine.stop)
            if (engine_pid := self.engine.launch()) is None:
                return 1
            started.append(self.api.stop)
            if (api_pid := self.api.launch("200")) is None:
                say(f"the engine keeps running (process group {engine_pid}): fix the API and run ./launch.sh "
                    "restart-api, or ./launch.sh stop")
                return 1
        print(self.summary(engine_pid, api_pid), flush=True)
        return 0

    def summary(self, engine_pid: int, api_pid: int) -> str:
        s, layout = self.layout.settings, self.layout
        info = self.engine.info()
        about = f"{info.ranks} rank(s), backend {info.backend}, context {info.context_length} tokens" if info else "?"
        auth = " -H 'Authorization: Bearer <API_KEY>'" if s.API_KEY else ""
        body = ('{"model":"%s","messages":[{"role":"user","content":"hello"}],"max_tokens":32}' % s.model_name)
        return "\n".join([
            "mlx-cluster-serve is up",
            f"  API      {layout.api_url}/v1   (pid {api_pid}, log {layout.api_log})",
            f"  engine   model {s.model_name}, {about}   (pid {engine_pid}, log {layout.engine_log})",
            f"  socket   {s.socket_path}",
            "",
            "try it:",
            f"  curl {layout.api_url}/v1/chat/completions -H 'Content-Type: application/json'{auth} \\",
            f"       -d '{body}'",
            "",
            "./launch.sh status | logs | restart-api | stop",
        ])

    # -- stop and the restarts ---------------------------------------------------------------

    def stop(self) -> int:
        # A stop runs to its end: interrupted halfway it would leave the API up without its engine. Held
        # from before the lock, so the reap of an overdue replaced API that comes with it is covered too.
        with held():
            with self.locked():
                self.engine.stop()
                self.api.stop()
                self.api.stop_draining()
            if noted():
                say("(the stop was interrupted by a signal; it completed anyway)")
        return 0

    def restart(self) -> int:
        # A setting the new API would refuse, or a model folder no rank could load, must not cost what runs.
        self.api.check_config()
        self.engine.refuse_broken_model()
        # Held across both halves: a signal during the stop lets it finish, then ends the restart there
        # (the user asked to stop); one before the start's first step undoes nothing and starts nothing.
        with held():
            self.stop()
            try:
                if noted():
                    raise Interrupted
                return self.start()
            except Interrupted:  # noted before the start's first step: nothing of it to undo
                say("interrupted: everything is stopped; nothing was started again (./launch.sh start starts it)")
                return 130

    def restart_api(self) -> int:
        with self.locked():
            # A setting the new API would refuse leaves the running one serving.
            self.api.check_config()
            want = "200"
            if self.engine.pids.running() is None or self.engine.info() is None:
                say("warning: the engine is not answering; the API will answer 503 until it is up")
                want = "any"
            # Zero downtime: the new API serves on the same port before the old one stops accepting, and
            # the old one's open streams run to their end (within API_DRAIN_TIMEOUT) instead of being cut.
            old = self.api.pids.running()
            if old is not None:
                with interruptible():
                    try:
                        handed = self.api.hand_over(old)
                    except Interrupted:
                        if self.api.roll_back():
                            say("interrupted: the restart-api was undone")
                        else:
                            say("interrupted after the new API took over; it serves")
                        return 130
                if handed == "ok":
                    return 0
                if handed == "failed":
                    say(f"the new API did not come up (see above); the previous API (process group {old}) keeps "
                        "serving: fix the cause and run ./launch.sh restart-api again")
                    return 1
                if handed == "none":
                    say(f"the new API did not come up (see above), and the previous API (process group {old}) ended "
                        "meanwhile: no API runs; fix the cause and run ./launch.sh restart-api again")
                    return 1
                if handed == "gone":
                    say(f"the previous API (process group {old}) ended meanwhile; starting the API")
                else:
                    say("the new API could not listen beside the running one (started without SO_REUSEPORT); "
                        "restarting it the plain way (its open requests get "
                        f"API_DRAIN_TIMEOUT={self.api.drain_of(self.api.pids.record()):g}s)")
            self.api.stop()
            self.api.refuse_running()
            return 0 if self.api.launch(want) is not None else 1

    def restart_engine(self, locked: bool = False) -> int:
        """locked: the caller holds the launch lock already (a switch, which wrote .env under it)."""
        # The stop half is done whole, as a stop; a signal during the start half undoes it, as a start's.
        stopped = "the engine is stopped; the API answers 503 until ./launch.sh restart-engine"
        with held():
            with contextlib.nullcontext() if locked else self.locked():
                self.engine.refuse_broken_model()  # before the stop: the running engine keeps serving
                self.engine.stop()
                try:
                    if noted():
                        raise Interrupted
                    self.engine.refuse_running()
                    with interruptible():
                        try:
                            if self.engine.launch() is None:
                                return 1
                        except Interrupted:
                            say("interrupted: stopping the engine this restart-engine began")
                            self.engine.stop()
                            say(stopped)
                            return 130
                except Interrupted:  # noted before the start half began: nothing of it to undo
                    say(f"interrupted: {stopped}")
                    return 130
        if self.api.pids.running() is None:
            say("note: the API is not running; start it with ./launch.sh restart-api")
        return 0

    def logs(self, which: str | None) -> int:
        layout = self.layout
        files = {"api": [layout.api_log, layout.api_console_log], "engine": [layout.engine_log],
                 "both": [layout.engine_log, layout.api_log, layout.api_console_log]}.get(which or "both")
        if files is None:
            raise Die(2, f"logs takes api, engine or nothing (both), not '{which}'")
        writable_dir("LOG_DIR", str(layout.settings.log_dir), layout.settings.log_dir)
        os.execvp("tail", ["tail", "-n", "100", "-F", *map(str, files)])
