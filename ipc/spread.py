"""What the spreading ranks (engine/spread) and ops/spread.py agree on without parsing each other's output.

Rank 0 writes one SpreadResult as JSON to the path ops gives it; ops reads it once mlx.launch has exited
(mlx.launch exits 0 whatever its ranks did, so its exit code says nothing).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from ipc.result_file import ResultFile
from ipc.test_hooks import hook

# "<host> <pid>" of the ops process that started the spread: rank 0 ends the spread when it is gone.
PARENT_ENV = "MCS_SPREAD_PARENT"
# The line rank 0 prints once every rank has joined (ops then quiets mlx.launch's stdin loop).
JOINED = "spread: every rank joined"


class SpreadResult(msgspec.Struct, frozen=True, kw_only=True):
    """How a spread ended, as rank 0 saw it."""

    ok: bool
    message: str
    bytes_sent: int = 0  # payload bytes rank 0 put on the wire (per receiver with send/recv)
    files_sent: int = 0  # distinct blobs streamed
    seconds: float = 0.0  # of streaming, checks excluded
    via: str = ""  # "sendrecv" or "allsum"


def test_hook(name: str, rank: int, environ: Mapping[str, str] | None = None) -> int | None:
    """NUMBER when the test hook `name` ("RANK:NUMBER,...") is set for this rank, and MCS_TEST_HOOKS=1."""
    for entry in hook(name, environ).split(","):
        who, _, number = entry.partition(":")
        if who.strip() == str(rank) and number.strip().isdigit():
            return int(number)
    return None


RESULT = ResultFile(SpreadResult)
encode_result, decode_result = RESULT.encode, RESULT.decode
