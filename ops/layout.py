"""Where the services keep their files, and how the commands talk to the user.

Every message goes to stderr prefixed as launch.sh's own; a fatal one is a `Die` with its exit code.
"""

from __future__ import annotations

import getpass
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from config import Settings

API_STOP_GRACE = 7  # seconds beyond API_DRAIN_TIMEOUT before the API gets SIGKILL (it flushes for 5 s)
ENGINE_STOP_GRACE = 5  # seconds beyond DRAIN_TIMEOUT before the engine gets SIGKILL
API_START_TIMEOUT = 30  # seconds for a fresh API to answer /health


class Die(Exception):
    """End the command: print the message as launch.sh's and exit with code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def say(message: str) -> None:
    """To stderr; a terminal that is gone (closed, the ssh session dropped) must not stop a clean-up."""
    try:
        print(message, file=sys.stderr, flush=True)
    except OSError:
        pass


def ceil_seconds(value: float) -> int:
    """Whole seconds, rounded up, at least 1; absurd values become a day."""
    if not math.isfinite(value) or value > 86400:
        return 86400
    return max(1, math.ceil(value))


def client_host(host: str) -> str:
    """The address a local client uses to reach host (as the API binds it)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host in ("::", "[::]"):
        return "[::1]"
    if ":" in host and not host.startswith("["):
        return f"[{host}]"
    return host


@dataclass(frozen=True)
class Layout:
    """The files of one configuration's services, and their timeouts."""

    settings: Settings

    @property
    def run_dir(self) -> Path:
        return self.settings.run_dir

    @property
    def engine_pid(self) -> Path:
        return self.run_dir / "engine.pid"

    @property
    def api_pid(self) -> Path:
        return self.run_dir / "api.pid"

    @property
    def engine_log(self) -> Path:
        return self.settings.log_dir / "engine.log"

    @property
    def api_log(self) -> Path:
        return self.settings.log_dir / "api.log"

    @property
    def api_console_log(self) -> Path:
        """What the API prints outside its log (start-up errors, tracebacks); api.log it rotates itself."""
        return self.settings.log_dir / "api.console.log"

    @property
    def api_url(self) -> str:
        return f"http://{client_host(self.settings.API_HOST)}:{self.settings.API_PORT}"

    @property
    def engine_stop_timeout(self) -> int:
        return ceil_seconds(self.settings.DRAIN_TIMEOUT) + ENGINE_STOP_GRACE

    @property
    def api_stop_timeout(self) -> int:
        return ceil_seconds(self.settings.API_DRAIN_TIMEOUT) + API_STOP_GRACE

    def draining_files(self) -> list[Path]:
        """Pid files of APIs that restart-api replaced and that may still finish open requests (api.draining.<pid>;
        not a file being written in their place, api.draining.<pid>.tmp.<writer>)."""
        return sorted(p for p in self.run_dir.glob("api.draining.*") if p.name.split(".", 2)[2].isdigit())

    def prepare_dirs(self) -> None:
        s = self.settings
        # RUN_DIR holds the engine socket: private when we create it (an existing one is left as is).
        writable_dir("RUN_DIR", str(s.run_dir), s.run_dir, 0o700)
        writable_dir("LOG_DIR", str(s.log_dir), s.log_dir)
        writable_dir("SOCKET_PATH", str(s.socket_path), s.socket_path.parent, 0o700)


def writable_dir(name: str, setting: str, path: Path, mode: int = 0o777) -> None:
    """Create path when missing; when we cannot write there, Die with one sentence naming the variable."""
    where = "that folder" if setting == str(path) else f"the folder {path}"
    if not path.is_dir():
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir(mode=mode)
        except OSError as exc:
            if not path.is_dir():
                raise Die(1, f"{name}={setting}: {where} cannot be created ({_why_not(path, exc)}); set {name} to a "
                             f"path you can write to, or create {path} and give yourself write access") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise Die(1, f"{name}={setting}: {where} is not writable by {_user()}; set {name} to a path you can write "
                     "to, or fix its permissions")


def _why_not(path: Path, exc: OSError) -> str:
    up = path
    while not up.exists() and up != up.parent:
        up = up.parent
    if up.exists() and not up.is_dir():
        return f"{up} is a file, not a folder"
    if up.is_dir() and not os.access(up, os.W_OK):
        return f"{up} is not writable"
    return exc.strerror or str(exc)


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "you"


def log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def show_log_tail(path: Path, offset: int, lines: int = 40) -> None:
    """The last lines written to path after byte offset (this start's)."""
    say(f"---- last {lines} lines of {path} ----")
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    tail = text.splitlines()[-lines:]
    if tail:
        say("\n".join(tail))
    say("----")
