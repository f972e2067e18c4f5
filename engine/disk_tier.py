"""Opening this rank's disk tier of the prefix cache at start-up, in the background: the model's identity (a digest
of its weights) can take a while the first time, and serving never waits for it; until it is open the tier is off
(engine/lockstep/disk.py: nothing written, every restore fails alike and computes). On rank 0 the files already
there are then read into its disk index (engine/rank0/disk_index.py), also without stalling anything.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# PROMPT_CACHE_DISK_BYTES=-1: this share of the disk's free space at start, at most DEFAULT_CAP_MAX
DEFAULT_CAP_SHARE = 0.10
DEFAULT_CAP_MAX = 100 << 30


def disk_cap(setting: int, folder: Path) -> int:
    """PROMPT_CACHE_DISK_BYTES, or for -1 a tenth of the free space of the disk folder sits on (at most 100 GiB)."""
    if setting >= 0:
        return setting
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return 0
    return min(int(free * DEFAULT_CAP_SHARE), DEFAULT_CAP_MAX)


def rank_folder(root: Path, model_dir: str, parallel: str, rank: int, size: int, layers, kv_bits, group: int) -> Path:
    """root / model identity / layout (this rank's shard) / KV precision; raises OSError where the weights cannot be
    digested."""
    from engine.diskcache.identity import layout_name, model_identity, precision_name

    identity = model_identity(Path(model_dir), cache_dir=Path(root))
    if identity is None:
        raise OSError(f"the weights in {model_dir} cannot be read to name the model")
    return Path(root) / identity / layout_name(size, rank, parallel, list(layers)) / precision_name(kv_bits, group)


def own_share(root: Path, folder: Path, cap: int) -> int:
    """The cap is this rank's for all of root: the entries other models (or KV precisions) left for this layout, which
    a switch back restores, keep at most half of it, the least recently used deleted first; folder gets the rest."""
    from engine.diskcache.tier import SUFFIX

    others = []
    for path in Path(root).glob(f"*/{folder.parent.name}/*/*{SUFFIX}"):
        with contextlib.suppress(OSError):  # gone meanwhile
            if path.parent != folder:
                st = path.stat()
                others.append((st.st_mtime_ns, st.st_size, path))
    held = sum(size for _, size, _ in others)
    for _, size, path in sorted(others):
        if held <= cap // 2:
            break
        path.unlink(missing_ok=True)
        held -= size
    return cap - held


def open_in_background(settings, loaded, rank: int, size: int,
                       on_open: Callable[[Any], None]) -> threading.Thread | None:
    """Open the tier in a daemon thread and hand it to on_open (there, also the start-up scan on rank 0);
    None where PROMPT_CACHE_DISK_BYTES=0 or the prefix cache is off."""
    if settings.PROMPT_CACHE_DISK_BYTES == 0 or settings.PROMPT_CACHE_BYTES == 0:
        return None

    def run() -> None:
        started = time.monotonic()
        try:
            from engine.diskcache.tier import DiskTier

            cap = disk_cap(settings.PROMPT_CACHE_DISK_BYTES, settings.prompt_cache_dir)
            if cap <= 0:
                log.warning("prefix cache disk tier off: no free space under %s", settings.prompt_cache_dir)
                return
            folder = rank_folder(settings.prompt_cache_dir, loaded.path, loaded.parallel, rank, size,
                                 loaded.pipeline_split, settings.kv_bits, settings.KV_GROUP_SIZE)
            # SPECULATIVE=mtp: entries hold the heads' KV and carry too, so they never mix with those of the model
            if hasattr(getattr(loaded, "model", None), "chain"):  # served without them
                folder = folder.with_name(folder.name + "+mtp")
            # copy=False: a queued entry's arrays are written from their own memory (kept alive until written), not
            # copied on the step thread first (113 ms for 100 MB here) nor held twice while queued
            tier = DiskTier(folder, own_share(settings.prompt_cache_dir, folder, cap), copy=False)
        except Exception as exc:  # the engine serves on without it: one line with the fix
            log.warning("prefix cache disk tier off: %s (set PROMPT_CACHE_DIR to a writable folder, or "
                        "PROMPT_CACHE_DISK_BYTES=0)", exc)
            return
        if tier.shared:  # another engine's folder: the tier said so, once
            tier.close()
            return
        log.info("prefix cache disk tier: %s, up to %.0f MiB (opened in %.1f s)", folder, cap / 2**20,
                 time.monotonic() - started)
        on_open(tier)

    thread = threading.Thread(target=run, name="disk-tier-open", daemon=True)
    thread.start()
    return thread


def scan_into(tier, index) -> None:
    """Rank 0: read the headers of the tier's files into its disk index (the calling thread; bounded by the files)."""
    started, n = time.monotonic(), 0
    try:
        for name, header in tier.scan():
            index.arrive(name, header)
            n += 1
    except Exception:
        log.exception("reading the disk tier's entries stopped after %d", n)
    log.info("prefix cache disk tier: %d entries read in %.2f s", n, time.monotonic() - started)
