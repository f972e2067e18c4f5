"""Which rank of a failed engine is to blame, from what the supervisor observed.

The ranks announce themselves through rank 0 (`Info.rank_states`) and exit with an `ExitCause`.
Only three things are read from the output the supervisor relays: mlx.launch's own line for each
rank that exited (the launcher offers nothing else); a rank's last CRITICAL line, which is
shown to the user as that rank's last words (a rank that could not load the model, `ExitCause.MODEL`,
says why in its ERROR line, which takes their place); and EBUSY in any line (JACCL's tracebacks carry no rank),
which adds a hint: what it means and what to do.
"""

from __future__ import annotations

import re
import signal
import threading
from dataclasses import dataclass, field

from ipc.lifecycle import VICTIM_CAUSES, ExitCause
from ipc.messages import RankState
from ops.procs import group_members
from ops.state import RankSeen

_NODE_EXIT = re.compile(r"Node with rank (\d+) (?:was (killed)|exited with code (-?\d+))")
_CRITICAL = re.compile(r"\brank(\d+) CRITICAL \S+: (.*)")
_ERROR = re.compile(r"\brank(\d+) ERROR \S+: (.*)")
# JACCL names the errno as a number ("[jaccl] Changing queue pair to RTR failed with errno 16"): EBUSY on macOS
_EBUSY = re.compile(r"\bEBUSY\b|device or resource busy|\bjaccl\b.*\berr(?:no|or)\b\D{0,3}16\b", re.IGNORECASE)

Exit = tuple[int, "int | None"]  # (rank, exit code); None: killed by the launcher


@dataclass
class Failure:
    """Which rank failed and how, in words for the log and `launch.sh status`."""

    summary: str
    rank: int | None
    detail: str = ""
    hint: str = ""  # what the failure means and what to do, when the output says (jaccl_busy)


@dataclass
class Observed:
    """What one run of the engine told the supervisor; the relay thread and the main loop share it."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    size: int = 0
    ranks: dict[int, RankSeen] = field(default_factory=dict)
    exits: list[Exit] = field(default_factory=list)
    last_words: dict[int, str] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)  # each rank's last ERROR line
    busy: bool = False  # a rank's output showed EBUSY (the RDMA devices still held)

    def announce(self, states: list[RankState], size: int) -> bool:
        """Take the ranks rank 0 reports; True when that added one."""
        with self.lock:
            self.size = max(self.size, size)
            before = len(self.ranks)
            for s in states:
                if s.pid:
                    self.ranks[s.rank] = RankSeen(rank=s.rank, pid=s.pid, host=s.host)
            return len(self.ranks) != before

    def read(self, line: str) -> None:
        """One line of the engine's output."""
        if _EBUSY.search(line):
            with self.lock:
                self.busy = True
        if m := _NODE_EXIT.search(line):
            with self.lock:
                self.exits.append((int(m.group(1)), None if m.group(2) else int(m.group(3))))
        elif m := _CRITICAL.search(line):
            with self.lock:
                self.last_words.setdefault(int(m.group(1)), m.group(2).strip())
        elif m := _ERROR.search(line):
            with self.lock:
                self.errors[int(m.group(1))] = m.group(2).strip()

    def seen(self) -> list[RankSeen]:
        with self.lock:
            return [self.ranks[r] for r in sorted(self.ranks)]

    def exited(self) -> list[Exit]:
        with self.lock:
            return list(self.exits)


def jaccl_busy(cooldown: float) -> str:
    """The one sentence for EBUSY from JACCL: what it means and the fix."""
    return ("JACCL found the RDMA devices busy (EBUSY): the ranks of an engine that crashed or was just stopped "
            f"still hold them; wait a minute and start again, raise JACCL_COOLDOWN (now {cooldown:g} s) so that "
            "starts wait longer after a stop, or reboot the Macs if it persists")


def describe_exit(code: int | None) -> str:
    if code is None:
        return "was killed by mlx.launch"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    if code == ExitCause.STALLED:
        return "was ended by its watchdog (no progress)"
    if code == ExitCause.PEER_LOST:
        return "lost its connection to a peer rank"
    if code == ExitCause.MODEL:
        return "could not load the model"
    return f"exited with code {code}"


def blame(observed: Observed, exits: list[Exit], why: str, pgid: int) -> Failure:
    """Name the failed rank: the first to exit for its own reasons, else the ones still running."""
    with observed.lock:
        ranks, size, words = dict(observed.ranks), observed.size, dict(observed.last_words)
        # the model's fault is in the rank's ERROR line (the file, the problem, what to do)
        words.update({rank: observed.errors[rank] for rank, code in exits
                      if code == ExitCause.MODEL and rank in observed.errors})

    def where(rank: int) -> str:
        seen = ranks.get(rank)
        return f" (pid {seen.pid} on {seen.host})" if seen else ""

    for rank, code in exits:
        if code not in VICTIM_CAUSES:
            return Failure(f"rank {rank}{where(rank)} {describe_exit(code)}", rank, words.get(rank, ""))
    exited = {rank for rank, _ in exits}
    suspects = [r for r in range(max(size, 1)) if r not in exited]
    if exits and suspects:
        victim, code = exits[0]
        rank = suspects[0]
        seen = ranks.get(rank)
        frozen = seen is not None and group_members(pgid).get(seen.pid) == "T"
        return Failure(f"rank {rank}{where(rank)} stopped responding{' (its process is stopped)' if frozen else ''}; "
                       f"rank {victim} {describe_exit(code)}", rank, words.get(victim, ""))
    if exits:
        rank, code = exits[0]
        return Failure(f"rank {rank}{where(rank)} {describe_exit(code)}", rank, words.get(rank, ""))
    return Failure(f"rank 0{where(0)} {why}", 0, words.get(0, ""))
