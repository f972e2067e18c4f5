"""Progress of a model transfer (a download, then the spreading to every host), for a person and the dashboard.

On a terminal: one line redrawn in place (bytes, total, rate, the file). Elsewhere (a log, a pipe): a plain
line every PLAIN_EVERY seconds and one per phase, so a log a person tails shows it without control codes.
Every update is also written (at most every STATE_EVERY seconds) to RUN_DIR/transfer.json, which the
API's dashboard reads; the last state stays there ("done" or "failed") until the next transfer.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TextIO

STATE_FILE = "transfer.json"
PLAIN_EVERY = 5.0
DRAW_EVERY = 0.1
STATE_EVERY = 0.5


@dataclass
class TransferState:
    """What RUN_DIR/transfer.json holds (read by the dashboard: keep the fields' names)."""

    model: str
    phase: str  # "download", "spread", "verify", "done" or "failed"
    bytes_done: int = 0
    bytes_total: int = 0
    rate: float = 0.0  # bytes per second over the phase so far
    file: str = ""  # the file being moved
    hosts: list[str] = field(default_factory=list)  # where this phase moves to (spread) or from (download)
    started: float = 0.0  # unix time the phase began
    updated: float = 0.0
    error: str = ""


def read_state(run_dir: Path) -> TransferState | None:
    try:
        doc = json.loads((run_dir / STATE_FILE).read_text())
        return TransferState(**doc)
    except (OSError, ValueError, TypeError):
        return None


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


class Progress:
    """One phase of a transfer: start it, add bytes as they move, end it with done() or failed()."""

    def __init__(self, run_dir: Path | None, model: str, phase: str, total: int, hosts: list[str] | None = None,
                 stream: TextIO | None = None):
        self.run_dir = run_dir
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        now = time.time()
        self.state = TransferState(model=model, phase=phase, bytes_total=total, hosts=list(hosts or []),
                                   started=now, updated=now)
        self._drawn = self._written = 0.0
        self._plain = now
        what = "to check" if phase == "verify" else "to move"
        whence = "from" if phase == "download" else "to"  # a download's hosts are where it fetches from
        self._say(f"{phase} {model}: {human_bytes(total)} {what}" + (f" {whence} {', '.join(hosts)}" if hosts else ""))
        self._write(force=True)

    def add(self, nbytes: int, file: str = "") -> None:
        s = self.state
        s.bytes_done += nbytes
        if file:
            s.file = file
        now = time.time()
        s.updated = now
        s.rate = s.bytes_done / max(now - s.started, 1e-6)
        if self.tty and now - self._drawn >= DRAW_EVERY:
            self._drawn = now
            self.stream.write("\r\033[K" + self.line())
            self.stream.flush()
        elif not self.tty and now - self._plain >= PLAIN_EVERY:
            self._plain = now
            self._say(self.line())
        if now - self._written >= STATE_EVERY:
            self._write()

    def line(self) -> str:
        s = self.state
        pct = f"{100 * s.bytes_done / s.bytes_total:5.1f}%" if s.bytes_total else "    -"
        return (f"{s.phase} {pct}  {human_bytes(s.bytes_done)} / {human_bytes(s.bytes_total)}  "
                f"{human_bytes(s.rate)}/s  {s.file}")

    def done(self, summary: str = "") -> None:
        self._end("done", summary or self.line())

    def failed(self, error: str) -> None:
        self.state.error = error
        self._end("failed", f"{self.state.phase} failed: {error}")

    def _end(self, phase: str, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        self._say(text)
        self.state.phase = phase
        self.state.updated = time.time()
        self._write(force=True)

    def _say(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def _write(self, force: bool = False) -> None:
        if self.run_dir is None:
            return
        now = time.time()
        if not force and now - self._written < STATE_EVERY:
            return
        self._written = now
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.run_dir, prefix=f".{STATE_FILE}.")
            with os.fdopen(fd, "w") as f:
                json.dump(asdict(self.state), f)
            os.replace(tmp, self.run_dir / STATE_FILE)
        except OSError:
            pass  # the dashboard's view is a convenience; the transfer goes on without it
