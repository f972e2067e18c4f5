"""Process groups, free ports and readiness waits: the one copy ops/, tests/ and bench/ share.

Everything we start runs in a session of its own, so its process group holds the launcher, its
forwarding threads and every local rank; stopping means signalling the group, never one pid.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TypeVar

T = TypeVar("T")

KILL_WAIT = 5.0  # seconds for the kernel to tear down what got SIGKILL


# ---- readiness --------------------------------------------------------------------------------


def poll(predicate: Callable[[], T], timeout: float, interval: float = 0.1, *,
         alive: Callable[[], bool] | None = None) -> T | None:
    """Call predicate until it returns something truthy (returned); None once alive() turns false
    or timeout passes (ask alive() which)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if alive is not None and not alive():
            return None
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def http_status(url: str, timeout: float = 2.0) -> int | None:
    """The HTTP status of a GET, or None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


# ---- ports ------------------------------------------------------------------------------------


# A port the kernel hands out as an outgoing connection's source port can be taken between our check and the
# server's bind (the ring backend's "Couldn't bind socket (error: 98)"), so ours come from below that range.
_LOW_PORT = 10000


def _ephemeral_start() -> int:
    """The first port the kernel may give an outgoing connection (Linux's setting; macOS and IANA use 49152)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 49152


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago and that no outgoing connection will take meanwhile."""
    return free_port_run(1)


def free_port_run(n: int) -> int:
    """The first of n consecutive free ports (the ring backend listens on port, port+1, ...), all below the
    kernel's range for outgoing connections so that none is taken between this check and the server's bind."""
    top = _ephemeral_start() - n
    rng = random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(_LOW_PORT, top) if top > _LOW_PORT else rng.randrange(1024, 65536 - n)
        if all(_bindable(base + k) for k in range(n)):
            return base
    raise RuntimeError(f"no {n} consecutive free ports found below {top + n}")


def free_ring_port(ranks: int) -> int:
    """A RING_PORT for an engine of `ranks` local ranks that a test or benchmark may start beside others: the
    doorbell's port below it, the ring's and a spread's above it, all free a moment ago."""
    return free_port_run(2 * ranks + 1) + 1


# ---- processes and groups ---------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One process as `ps` lists it."""

    pid: int
    pgid: int
    state: str  # the first letter of ps's STAT: R, S, T (stopped), Z (zombie), ...


class Unreadable(Exception):
    """ps could not be run or did not answer (a fork failure, a timeout): nothing is known of the process,
    which is no evidence that it is gone or another."""


def processes() -> list[Row]:
    """Every process of this host but zombies (which linger until their parent reaps them); none when ps fails."""
    try:
        return listed_processes()
    except Unreadable:
        return []


def listed_processes() -> list[Row]:
    """As processes(), but Unreadable when ps fails."""
    try:
        ps = subprocess.Popen(["ps", "-A", "-o", "pid=", "-o", "pgid=", "-o", "stat="], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True)
        out, _ = ps.communicate(timeout=10)
    except subprocess.TimeoutExpired as exc:
        ps.kill()
        ps.wait()
        raise Unreadable("ps did not answer") from exc
    except OSError as exc:
        raise Unreadable(f"ps: {exc}") from exc
    if ps.returncode != 0 and not out.strip():
        raise Unreadable(f"ps failed (exit {ps.returncode})")
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0].isdigit() and parts[1].isdigit() and not parts[2].startswith("Z"):
            if int(parts[0]) != ps.pid:
                rows.append(Row(int(parts[0]), int(parts[1]), parts[2][0]))
    return rows


def group_members(pgid: int, spare: Iterable[int] = (), *, strict: bool = False) -> dict[int, str]:
    """Live processes of process group pgid but those in spare: pid -> state letter. With strict, Unreadable
    when ps fails (else none are listed)."""
    skip = set(spare)
    rows = listed_processes() if strict else processes()
    return {r.pid: r.state for r in rows if r.pgid == pgid and r.pid not in skip}


def pid_exists(pid: int, *, group: bool = False) -> bool:
    """kill -0 (of the process group with group): true for anything we could signal, zombies included."""
    try:
        (os.killpg if group else os.kill)(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def group_alive(pgid: int) -> bool:
    """True while any process of the group runs (orphaned ranks included; zombies not). When ps fails, the
    kernel's word (kill -0) stands: a group we cannot list is not thereby gone."""
    if not pid_exists(pgid, group=True):
        return False
    try:
        return bool(group_members(pgid, strict=True))
    except Unreadable:
        return True


def group_frozen(pgid: int) -> bool:
    """True when every live process of the group is stopped (SIGSTOP: ps's STAT T on Linux and macOS): it
    can act on no TERM, yet its listening socket still takes connections. False when ps cannot tell."""
    try:
        members = group_members(pgid, strict=True)
    except Unreadable:
        return False
    return bool(members) and all(state == "T" for state in members.values())


# Readings of group_frozen, one second apart, before a stopped group counts as frozen for good: macOS's ps also
# shows T for a process a debugger or a sampler (py-spy, spindump) holds for a moment.
FROZEN_READINGS = 3
FROZEN_SPACING = 1.0


def group_frozen_for_good(pgid: int, readings: int = FROZEN_READINGS, spacing: float = FROZEN_SPACING) -> bool:
    """group_frozen on every one of readings, spacing seconds apart."""
    for i in range(readings):
        if i:
            time.sleep(spacing)
        if not group_frozen(pgid):
            return False
    return True


def process_alive(pid: int) -> bool:
    """True while pid itself runs, not as a zombie; a pid that ps cannot list while kill -0 finds it counts
    as running (a failed ps is no proof that a supervisor is gone)."""
    if not pid_exists(pid):
        return False
    try:
        return any(r.pid == pid for r in listed_processes())
    except Unreadable:
        return True


def group_gone(pgid: int, spare: Iterable[int] = ()) -> bool:
    """True once no process of the group but those in spare runs. When ps fails only kill -0 can prove the
    group gone, and not with spare (the caller, still in the group)."""
    try:
        return not group_members(pgid, spare, strict=True)
    except Unreadable:
        return not spare and not pid_exists(pgid, group=True)


def _ps_field(pid: int, field: str) -> str | None:
    """One ps column of pid, in the C locale and UTC so that every caller reads the same text; None when pid
    is gone, Unreadable when ps failed while it may still run."""
    try:
        r = subprocess.run(["ps", "-ww", "-o", f"{field}=", "-p", str(pid)], capture_output=True, text=True,
                           timeout=10, env={**os.environ, "LC_ALL": "C", "TZ": "UTC0"})
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unreadable(f"ps -p {pid}: {exc}") from exc
    out = r.stdout.strip()
    if r.returncode == 0 and out:
        return out
    if pid_exists(pid):
        raise Unreadable(f"ps -p {pid} failed (exit {r.returncode}) while the pid exists")
    return None


def process_start(pid: int) -> str | None:
    """When pid started, as text that tells it from any later process given the same pid; None when gone,
    Unreadable when it could not be read.

    Linux: the boot id and the start time in clock ticks (/proc); elsewhere (macOS) ps's lstart.
    """
    if pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        if Path("/proc/self/stat").exists():
            return None  # a Linux without this pid
        return _ps_field(pid, "lstart")
    except ProcessLookupError:
        return None
    except OSError as exc:
        raise Unreadable(f"/proc/{pid}/stat: {exc}") from exc
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "-"
    fields = stat.rsplit(")", 1)[-1].split()
    return f"{boot}/{fields[19]}" if len(fields) > 19 else None


def command_line(pid: int) -> str | None:
    """pid's command and arguments, as ps shows them; None when gone, Unreadable when ps failed."""
    return _ps_field(pid, "command") if pid > 0 else None


def _send(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_group(pgid: int, grace: float, *, spare: Iterable[int] = (),
               on_kill: Callable[[dict[int, str]], None] | None = None) -> bool:
    """TERM the group, wait up to grace for it to end, then KILL what is left; True once it is gone.

    Stopped (frozen) processes get KILL at once: they never act on TERM. With spare (the caller,
    when it leads the group itself) the others are signalled one by one instead of as a group.
    A ps that fails lists nothing, which proves nothing: the group counts as running until kill -0 finds it
    gone, so it gets its KILL when due.
    """
    spare = set(spare)
    members = group_members(pgid, spare)
    _send([pid for pid, state in members.items() if state == "T"], signal.SIGKILL)
    if spare:
        _send([pid for pid, state in members.items() if state != "T"], signal.SIGTERM)
    else:
        signal_group(pgid, signal.SIGTERM)
    if poll(lambda: group_gone(pgid, spare), grace):
        return True
    try:
        left = group_members(pgid, spare, strict=True)
    except Unreadable:
        left = {}  # unknown: the group gets its KILL whole, one by one there is no one to name
    else:
        if not left:
            return True  # it ended as the grace ran out
    if on_kill is not None and (left or not spare):
        on_kill(left)
    if spare:
        _send(left, signal.SIGKILL)
    else:
        signal_group(pgid, signal.SIGKILL)
    return bool(poll(lambda: group_gone(pgid, spare), KILL_WAIT))


def spawn_group(cmd: list[str], log_path, *, stdin=subprocess.DEVNULL, env: dict | None = None,
                cwd=None) -> subprocess.Popen:
    """Start cmd in a new session (its pid is its process group) with stdout and stderr appended to log_path."""
    with open(log_path, "ab") as out:
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdin=stdin, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


@dataclass
class Group:
    """A process group we started and wait for (tests, benchmarks); stop() ends all of it."""

    popen: subprocess.Popen
    log: Path
    name: str = ""
    stdin: IO[bytes] | None = None  # mlx.launch's open, silent stdin, kept open for its whole life

    @classmethod
    def spawn(cls, cmd: list[str], log: Path, *, name: str = "", stdin_pipe: bool = False, env: dict | None = None,
              cwd=None) -> Group:
        popen = spawn_group(cmd, log, stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL, env=env, cwd=cwd)
        return cls(popen, Path(log), name, popen.stdin)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def signal(self, sig: int) -> None:
        signal_group(self.popen.pid, sig)

    def release_stdin(self) -> None:
        """The one byte that quiets mlx.launch once its ranks have pointed their own stdin at /dev/null."""
        if self.stdin is not None:
            try:
                self.stdin.write(b"x")
                self.stdin.flush()
            except OSError:
                pass

    def stop(self, timeout: float = 15.0) -> None:
        """TERM the group, KILL what is left after timeout (ranks the launcher did not reap), then reap."""
        stop_group(self.popen.pid, timeout)
        try:
            self.popen.wait(KILL_WAIT)
        except subprocess.TimeoutExpired:
            pass
        if self.stdin is not None:
            try:
                self.stdin.close()
            except OSError:
                pass
