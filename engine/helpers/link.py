"""Where rank 0 reaches the helper rank (HELPER_RANK=k, k > 0): one startup gather every rank joins alike.

Rank k listens on a free TCP port of the interface it reached rank 0's doorbell from (so rank 0 can reach it
back) and contributes the address, the port and a random token; the other ranks contribute zeros. Rank 0 then
opens one connection per helper request (engine/rank0/helper_remote.py), presenting the token. A rank k that could
not listen contributes zeros too, and every rank ends with the same sentence (engine/helpers/rank_setup.py
opens it all). No MLX here.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.lockstep.doorbell import DoorbellError, Gather

HOST_BYTES = 64  # an IPv6 address in text fits


class HelperLinkError(DoorbellError):
    """The helper rank's listener cannot be opened or reached: the engine cannot start as configured."""


@dataclass(frozen=True)
class Address:
    """The helper rank's listener, and the token that opens it."""

    host: str
    port: int
    token: int  # 62 bits, sent as two int31s


def row(address: Address | None) -> list[int]:
    """This rank's contribution to the gather: the helper rank's address, zeros from every other rank."""
    if address is None:
        return [0] * (3 + HOST_BYTES)
    host = address.host.encode()[:HOST_BYTES]
    return [address.port, address.token >> 31, address.token & 0x7FFFFFFF, *host.ljust(HOST_BYTES, b"\0")]


def read(values: list[int]) -> Address | None:
    """The address in a row (None: zeros, the helper rank could not listen)."""
    port, high, low, *host = values
    if not port:
        return None
    return Address(bytes(b for b in host if b).decode(), port, (high << 31) | low)


def exchange(gather: Gather, helper_rank: int, mine: Address | None, why: str = "") -> Address:
    """Every rank: the helper rank's address (mine on that rank, None elsewhere); HelperLinkError when it has none."""
    rows = gather(row(mine))
    found = read(rows[helper_rank])
    if found is None:
        raise HelperLinkError(f"rank {helper_rank} (HELPER_RANK) could not listen for helper requests"
                              + (f" ({why})" if why else " (see its log)")
                              + "; free a TCP port on that host or set HELPER_RANK=0")
    return found

