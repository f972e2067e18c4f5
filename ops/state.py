"""The engine supervisor's record in RUN_DIR/engine.state.json: written by ops.supervisor, read by status."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec


class RankSeen(msgspec.Struct, kw_only=True):
    """One rank of the running engine, as rank 0 announced it."""

    rank: int
    pid: int
    host: str


class LastFailure(msgspec.Struct, kw_only=True):
    """Which rank failed and how, in words (the supervisor's verdict)."""

    time: float
    summary: str
    rank: int | None
    detail: str = ""
    hint: str = ""  # what it means and what to do, where the output told (ops/failures.py)


class EngineState(msgspec.Struct, kw_only=True):
    """What the supervisor (pid) is doing, and what it saw."""

    pid: int
    state: str = "starting"  # starting, running, restarting, stopping, stopped, failed
    restart: str = "never"  # ENGINE_RESTART
    restarts: int = 0
    engine_pid: int = 0
    ranks: list[RankSeen] = []
    last_failure: LastFailure | None = None
    next_restart_at: float | None = None


# States of a supervisor at work: one found in the file of a dead supervisor means it was killed.
ACTIVE = frozenset({"starting", "running", "restarting", "stopping"})

_decoder = msgspec.json.Decoder(EngineState)


def state_path(run_dir: Path) -> Path:
    return Path(run_dir) / "engine.state.json"


def write_state(path: Path, state: EngineState) -> None:
    """Atomically: a reader sees the old record or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_bytes(msgspec.json.encode(state))
    os.replace(tmp, path)


def read_state(path: Path, pid: int) -> EngineState | None:
    """The record of supervisor pid; None when there is none (or it was left by another start)."""
    try:
        state = _decoder.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return None
    return state if state.pid == pid else None
