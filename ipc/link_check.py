"""What `./launch.sh check --links` (ops/link_check.py) and its ranks (engine/link_check.py) agree on.

Rank 0 writes one LinkCheckResult as JSON to the path ops gives it; ops reads it once mlx.launch has exited
(mlx.launch exits 0 whatever its ranks did, so its exit code says nothing).
"""

from __future__ import annotations

import msgspec

from ipc.messages import LinkState

# The line rank 0 prints once every rank has joined (ops then quiets mlx.launch's stdin loop).
JOINED = "links: every rank joined"
# Test hook, read only by the checking ranks: "RANK:CODE" makes that rank exit with CODE once every rank joined.
TEST_EXIT = "MCS_LINKS_TEST_EXIT"


class LinkCheckResult(msgspec.Struct, frozen=True, kw_only=True):
    """Every rank met over the plan channel and probed its links; rank 0's figures for each pair."""

    ranks: int
    backend: str
    hosts: list[str]
    links: list[LinkState]


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(LinkCheckResult)


def encode_result(result: LinkCheckResult) -> bytes:
    """The result as JSON."""
    return _encoder.encode(result)


def decode_result(data: bytes) -> LinkCheckResult:
    """Raises msgspec.ValidationError / DecodeError when data is not a result."""
    return _decoder.decode(data)
