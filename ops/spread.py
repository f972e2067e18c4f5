"""Spread a downloaded model from rank 0's cache to every other rank's (interface; the transfer is being built).

`spread(settings, manifest)` makes every rank's cache (Settings.hub_cache(rank)) hold the manifest's files,
checked by size and sha256, with the manifest written last. Ranks whose cache is rank 0's own (same host,
same folder) need nothing.
"""

from __future__ import annotations

from config import Settings
from config.hub_cache import Manifest


def targets(settings: Settings, hosts: list[str]) -> list[int]:
    """Ranks (in rank order, rank 0 excluded) whose host or cache folder differs from rank 0's."""
    local = {"127.0.0.1", "localhost", "::1"}
    out = []
    for rank in range(1, len(hosts)):
        same_host = hosts[rank] == hosts[0] or {hosts[rank], hosts[0]} <= local
        if not same_host or settings.hub_cache(rank) != settings.hub_cache(0):
            out.append(rank)
    return out


def spread(settings: Settings, manifest: Manifest, hosts: list[str]) -> int:
    """0 when every rank holds the model whole; else 1 after saying why."""
    if not targets(settings, hosts):
        return 0
    raise NotImplementedError("spreading to other hosts is being built")
