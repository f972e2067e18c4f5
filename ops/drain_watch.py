"""`python -m ops.drain_watch FILE SECONDS`: restart-api starts it beside the API it replaced (FILE, an
api.draining.<pid> file). SECONDS after that API was told to stop, if it still runs it gets KILL: a
frozen or hung API would otherwise keep listening on the shared port, and take connections, forever.
It ends as soon as the API is gone (removing FILE), or FILE is (ops removes it when the API was stopped
another way)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ops.pidfile import PidFile
from ops.procs import FROZEN_READINGS, group_frozen, stop_group

CHECK_EVERY = 1.0  # seconds between looks at the replaced API
KILL_GRACE = 1.0  # seconds between the TERM and the KILL of an overdue API


def watch(path: Path, seconds: float) -> int:
    pids = PidFile(path)
    record = pids.record()
    if record is None:
        return 0
    deadline = (record.stopping_since or time.time()) + seconds
    frozen = 0  # readings in a row that found it stopped (SIGSTOP): such an API can never drain
    while True:
        record, pid, why = pids.judge()
        if pid is None:
            pids.drop(record)  # drained and gone (or stale): its file goes with it
            return 0
        frozen = frozen + 1 if group_frozen(pid) else 0
        if time.time() >= deadline or frozen >= FROZEN_READINGS:  # one reading may be a debugger's pause
            break
        time.sleep(CHECK_EVERY)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} ops.drain_watch: the previous API (process group {pid}) still "
          f"runs {time.time() - deadline + seconds:.0f}s after restart-api told it to stop (hung or frozen): "
          "killing it", flush=True)
    if stop_group(pid, KILL_GRACE):
        pids.drop(record)  # else it is not proven gone: the next locked command judges it again
    return 0


if __name__ == "__main__":
    sys.exit(watch(Path(sys.argv[1]), float(sys.argv[2])))
