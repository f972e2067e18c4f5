"""What an engine rank and its supervisor agree on without parsing each other's output.

A rank's exit code is an `ExitCause`; the supervisor names a failed rank from it. The supervisor
tells rank 0 who it is through `SUPERVISOR_ENV`, so an engine whose supervisor died stops itself.
"""

from __future__ import annotations

from enum import IntEnum

# "<host> <pid>" of the supervisor, set in the environment of the engine it starts.
SUPERVISOR_ENV = "ENGINE_SUPERVISOR"


class ExitCause(IntEnum):
    """Why an engine rank exited."""

    CLEAN = 0  # asked to stop, drained
    FAILED = 1  # could not start: the model, the socket, another engine already serving
    CONFIG = 2  # a setting is invalid
    DESYNC = 3  # the ranks diverged; ended on purpose rather than serve wrong tokens
    PEER_LOST = 4  # a collective lost its peer rank
    MODEL = 5  # the model folder cannot be loaded (its ERROR line names the file)
    STALLED = 70  # the watchdog saw no progress (a peer is dead or frozen)


# Causes of a rank that ended because another rank failed: the culprit is elsewhere.
VICTIM_CAUSES = frozenset({ExitCause.STALLED, ExitCause.PEER_LOST})
