"""One rank's disk tier: entries written by a thread of its own, an LRU under a byte cap, loaded on demand.

put() runs on the step thread: it copies the entry to the host (a memcpy) and queues it; the writer thread
serialises, checksums and writes it, so a step never waits on the disk. A full queue skips the entry (the RAM tier
still holds it). A file is evicted, oldest use first, before a write would pass the cap; the order survives a
restart through the files' mtimes (a load touches its file). A write that fails (a full disk, a quota) stops the
spilling with one warning: the engine serves on from RAM, and no client ever sees it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import queue
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from engine.diskcache import files
from engine.diskcache.structure import HostEntry, Unsupported, from_host

log = logging.getLogger(__name__)

SUFFIX = ".kv"
QUEUE = 4  # entries waiting for the writer (each a host copy held in memory)
SCANNERS = 8  # headers read at once by scan()
# names the LRU evicted, kept for rank 0's index to forget (take_evicted, every plan); on other ranks nobody takes
# them, so only the latest are kept: a name lost here costs one restore that fails alike on every rank and computes
EVICTED = 4096
_FULL = (errno.ENOSPC, errno.EDQUOT)
LOCK = ".lock"  # beside the folder (its name + this), flock'd by the one engine using it: two would each hold the
# cap, and clean up each other's writes; beside it, the folder holds entries and nothing else


def _lock(folder: Path) -> int | None:
    """An open descriptor holding the folder's exclusive lock (released when closed), or None where another process
    holds it. A file system without locks (some network mounts) counts as unshared: nothing better can be known."""
    fd = os.open(folder.with_name(folder.name + LOCK), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except OSError as exc:
        log.debug("prefix cache on disk: %s cannot be locked (%s)", folder, exc)
    return fd


def _alive(tmp_name: str) -> bool:
    """Whether the process whose pid a tmp file's name carries (files.write_file) still runs: it may be writing it."""
    try:
        os.kill(int(tmp_name.rsplit(".", 2)[-2]), 0)
    except (ValueError, IndexError, ProcessLookupError):
        return False
    except PermissionError:  # another user's process
        return True
    return True


class DiskTier:
    """The entries of one folder (a model identity, layout and precision), at most cap_bytes of files."""

    def __init__(self, folder: Path, cap_bytes: int, queue_entries: int = QUEUE, copy: bool = True) -> None:
        """Raises OSError when the folder cannot be made. copy: whether put() copies the arrays (see
        files.host_copy: with False, a queued entry's arrays stay alive until written, at no cost to the step)."""
        self.folder, self.cap, self.copy = folder, cap_bytes, copy
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)  # a folder made before (or by another umask) is closed too
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._index: OrderedDict[str, int] = OrderedDict()  # name -> bytes, least recently used first
        self._pending: dict[str, tuple[int, HostEntry]] = {}  # queued writes, by name: (ticket, host copy)
        self._ticket = 0
        self._busy = 0  # entries queued or being written
        self._stopped = False  # a write failed: spilling is off until the engine starts again
        self._closed = False
        self._told_kind = False  # the warning that a cache kind cannot be written, given once
        self._evicted: deque[str] = deque(maxlen=EVICTED)
        self.counts = dict(writes=0, write_failures=0, restores=0, restore_failures=0, bytes_restored=0,
                           seconds_restoring=0.0, skipped=0, evictions=0)
        self._clock = 0
        self._held = _lock(folder)
        self.shared = self._held is None  # another engine writes here: this one is off (put skips, nothing listed)
        if self.shared:
            self._stopped = True
            log.warning("prefix cache on disk: another engine is using %s, so this one's disk tier is off; give each "
                        "engine its own PROMPT_CACHE_DIR", folder)
        else:
            self._load_index()
        self._queue: queue.Queue[tuple[str, int, HostEntry, dict, list[str]] | None] = queue.Queue(queue_entries)
        self._writer = threading.Thread(target=self._write_loop, name=f"disk-tier {folder.name}", daemon=True)
        self._writer.start()

    # -- the step thread's side -----------------------------------------------------------------------------
    def put(self, name: str, layers: list[Any], header: dict, replaces: list[str] = ()) -> None:
        """Queue the entry's write; never raises, never waits for the disk. replaces: entries it supersedes, deleted
        once it is written (a write skipped or failed leaves them: what a restart finds stays usable)."""
        if self._stopped or self._closed or self.cap <= 0 or self._queue.full():
            self._skip(name, "the writer is behind" if self._queue.full() else "spilling is off")
            return
        try:
            entry = files.host_copy(layers, self.copy)
        except Unsupported as exc:
            if not self._told_kind:
                self._told_kind = True
                log.warning("prefix cache on disk: %s, so this model's entries stay in RAM only", exc)
            self._skip(name, str(exc))
            return
        if entry.nbytes > self.cap:
            self._skip(name, f"{entry.nbytes} bytes, over the cap of {self.cap}")
            return
        with self._lock:
            self._ticket += 1
            ticket = self._ticket
            self._pending[name] = (ticket, entry)
            self._busy += 1
        try:
            self._queue.put_nowait((name, ticket, entry, header, list(replaces)))
        except queue.Full:  # only when put() is called from two threads at once
            self._finished(name, ticket)
            self._skip(name, "the writer is behind")

    def load(self, name: str) -> list[Any] | None:
        """The entry's caches, or None when it is missing or damaged (a damaged file is deleted)."""
        start = time.perf_counter()
        with self._lock:
            queued = self._pending.get(name)
        try:
            if queued is not None:  # not on disk yet: its host copy is the entry
                layers, size = from_host(queued[1]), queued[1].nbytes
            else:
                layers, _ = files.read_file(self._path(name))
                size = self._index.get(name, 0)
        except files.DamagedEntry as exc:
            missing = not self._path(name).exists()
            if not missing:
                log.warning("prefix cache on disk: %s; deleted, the entry will be computed", exc)
            self.delete(name)
            self._count(restore_failures=1)
            return None
        self._touch(name)
        self._count(restores=1, bytes_restored=size, seconds_restoring=time.perf_counter() - start)
        return layers

    def delete(self, name: str) -> None:
        with self._lock:
            self._drop(name)

    def _drop(self, name: str) -> None:
        """The entry's file and a queued write of it go (the lock held)."""
        self._pending.pop(name, None)
        self._index.pop(name, None)
        self._path(name).unlink(missing_ok=True)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._index)

    def size(self, name: str) -> int:
        """The bytes of the entry's file (0: not on disk)."""
        with self._lock:
            return self._index.get(name, 0)

    def take_evicted(self) -> list[str]:
        """The names the byte cap deleted since last asked (rank 0's index forgets them: never restored)."""
        with self._lock:
            out = list(self._evicted)
            self._evicted.clear()
            return out

    def scan(self) -> Iterator[tuple[str, dict]]:
        """(name, header) of every file present (damaged ones are deleted): what rank 0 rebuilds its index from,
        on a thread of its own (the step thread may put, load and delete meanwhile). Several files are read at
        once: an SSD answers many small reads in the time of a few in turn."""
        names = self.names()
        with ThreadPoolExecutor(SCANNERS, thread_name_prefix="disk-tier-scan") as pool:
            for at in range(0, len(names), 8 * SCANNERS):  # a window at a time: headers wait for their reader
                for name, header in pool.map(self._header, names[at:at + 8 * SCANNERS]):
                    if header is not None:
                        yield name, header

    def _header(self, name: str) -> tuple[str, dict | None]:
        try:
            return name, files.read_header(self._path(name))
        except files.DamagedEntry as exc:
            if self._path(name).exists():  # gone meanwhile is evicted: nothing to do (a put may follow)
                log.warning("prefix cache on disk: %s; deleted", exc)
                with self._lock:
                    self._index.pop(name, None)
                    self._path(name).unlink(missing_ok=True)
            return name, None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return dict(entries=len(self._index), bytes=sum(self._index.values()), cap=self.cap, **self.counts)

    def flush(self, timeout: float) -> bool:
        """Wait until every queued entry is written (or dropped); whether it happened within timeout."""
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Write what is queued, then stop the writer."""
        self._closed = True
        self._queue.put(None)
        self._writer.join(timeout)
        held, self._held = self._held, None
        if held is not None:
            os.close(held)  # the lock goes with it: the folder is free for the next engine

    # -- the writer thread ----------------------------------------------------------------------------------
    def _write_loop(self) -> None:
        while (item := self._queue.get()) is not None:
            name, ticket, entry, header, replaces = item
            try:
                self._write(name, ticket, entry, header, replaces)
            except Exception:  # a header msgpack cannot encode: a bug to log, never the writer's end
                log.exception("prefix entry %s not written to disk", name)
                self._count(write_failures=1)
            finally:
                self._finished(name, ticket)

    def _finished(self, name: str, ticket: int) -> None:
        with self._idle:
            if self._pending.get(name, (None,))[0] == ticket:
                del self._pending[name]
            self._busy -= 1
            self._idle.notify_all()

    def _write(self, name: str, ticket: int, entry: HostEntry, header: dict, replaces: list[str]) -> None:
        if self._pending.get(name, (None,))[0] != ticket:
            return  # deleted (or put again) since it was queued
        if self._stopped:
            self._skip(name, "spilling is off")
            return
        size = files.file_size(entry, header)
        if size > self.cap:
            self._skip(name, f"{size} bytes, over the cap of {self.cap}")
            return
        with self._lock:  # room for it, counting the file it replaces as gone
            self._evict(self.cap - size + self._index.get(name, 0), keep=name)
        path = self._path(name)
        try:
            written = files.write_file(path, entry, header)
        except OSError as exc:
            self._stop(exc)
            return
        with self._lock:
            if self._pending.get(name, (None,))[0] != ticket:  # deleted while being written
                path.unlink(missing_ok=True)
                return
            self._index[name] = written
            self._stamp(name)
            for old in replaces:
                if old != name:
                    self._drop(old)
            self._evict(self.cap, keep=name)
            self.counts["writes"] += 1

    def _evict(self, room: int, keep: str = "") -> None:
        """Delete the least recently used files until the rest fit in room bytes (the lock held)."""
        total = sum(self._index.values())
        for old in list(self._index):
            if total <= room:
                return
            if old != keep:
                total -= self._index.pop(old)
                self._path(old).unlink(missing_ok=True)
                self._evicted.append(old)
                self.counts["evictions"] += 1

    def _stop(self, exc: OSError) -> None:
        with self._lock:
            self.counts["write_failures"] += 1
            first, self._stopped = not self._stopped, True
        if first:
            why = "the disk is full" if exc.errno in _FULL else "a write failed"
            log.warning("prefix cache on disk: %s (%s); no more entries are written to %s until the engine "
                        "restarts: free space there or lower PROMPT_CACHE_DISK_BYTES", why, exc, self.folder)

    # -- helpers --------------------------------------------------------------------------------------------
    def _path(self, name: str) -> Path:
        return self.folder / (name + SUFFIX)

    def _skip(self, name: str, why: str) -> None:
        log.debug("prefix entry %s not written to disk: %s", name, why)
        self._count(skipped=1)

    def _count(self, **add: float) -> None:
        with self._lock:
            for k, v in add.items():
                self.counts[k] += v

    def _touch(self, name: str) -> None:
        with self._lock:
            if name in self._index:
                self._index.move_to_end(name)
                self._stamp(name)

    def _stamp(self, name: str) -> None:
        """Set the file's mtime to a time later than every other's (the lock held): the order a restart finds, even
        where the file system's clock ticks coarser than two uses."""
        self._clock = max(time.time_ns(), self._clock + 1)
        with contextlib.suppress(OSError):  # a stamp lost costs only the order
            os.utime(self._path(name), ns=(self._clock, self._clock))

    def _load_index(self) -> None:
        """The files present, oldest use first; a crash's leftover tmp files removed (the lock held: no other engine
        of ours writes here, but a process still running may be finishing a write)."""
        found = []
        with os.scandir(self.folder) as it:
            for e in it:
                if e.name.endswith(".tmp"):
                    if not _alive(e.name):
                        Path(e.path).unlink(missing_ok=True)
                elif e.name.endswith(SUFFIX) and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    found.append((st.st_mtime_ns, e.name[:-len(SUFFIX)], st.st_size))
        for _, name, size in sorted(found):
            self._index[name] = size
        self._clock = max((t for t, _, _ in found), default=0)
