"""What `./launch.sh check --links` (ops/link_check.py) and its ranks (engine/link_check.py) agree on.

Rank 0 writes one LinkCheckResult as JSON to the path ops gives it; ops reads it once mlx.launch has exited
(mlx.launch exits 0 whatever its ranks did, so its exit code says nothing).
"""

from __future__ import annotations

import msgspec

from ipc.messages import LinkState
from ipc.result_file import ResultFile

# The line rank 0 prints once every rank has joined (ops then quiets mlx.launch's stdin loop).
JOINED = "links: every rank joined"
# Test hook, read only by the checking ranks under MCS_TEST_HOOKS=1 (ipc/test_hooks.py): "RANK:CODE" makes that rank
# exit with CODE once every rank joined.
TEST_EXIT = "MCS_LINKS_TEST_EXIT"


class LinkCheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """Every rank met over the plan channel and probed its links; rank 0's figures for each pair."""

    ranks: int
    backend: str
    hosts: list[str]
    links: list[LinkState]


RESULT = ResultFile(LinkCheckResult)
