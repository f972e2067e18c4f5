"""One rank's shard of one prefix-cache entry as one file, and back.

    magic (6 bytes) | version (u16) | header length (u32) | header's crc32 (u32)
    header: msgpack {"header": the caller's dict, "layers": structure, "arrays": [[dtype, shape, offset, bytes]],
            "data": the data's length, "mlx_lm": the version whose cache classes wrote it}
    the arrays' raw bytes from the next 64-byte boundary, each at a 64-byte boundary (offsets from there)
    crc32 (u32) of each 4 MiB block of every byte before them

All integers little-endian. read_header reads the first two parts only (rank 0 rebuilds its index from them at
start-up); read_file checks every byte and raises DamagedEntry on any mismatch, so a torn, truncated or flipped
file is computed again, never reused. The write is a tmp file in the same folder renamed over the name, without
fsync: a file that a power loss leaves torn fails its checksum and is computed again.

Checksum: zlib.crc32, measured on 100 MB here (x86, one core, under load): blake2b 0.50 GB/s, sha256 1.06 GB/s,
crc32 2.31 GB/s (plain memcpy 1.45 GB/s). It catches damage, not an attacker (a process that can write these 0600
files can do worse), so the fastest in the standard library, one per block: the blocks are checked on several
threads while the next ones are read (zlib releases the GIL), so a restore runs near the disk's read rate.
"""

from __future__ import annotations

import os
import struct
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx_lm
import msgspec

from engine.diskcache.structure import HostEntry, Unsupported, empty, host_copy, kinds, restore, writable_bytes

__all__ = ["DamagedEntry", "HostEntry", "file_size", "host_copy", "kinds", "read_file", "read_header", "write_file"]

MAGIC = b"MCSKV\x00"
VERSION = 1  # bump it when a cache class of engine/kvquant changes its attributes
# A restored cache is built without __init__ from the attributes written: another mlx-lm may give its classes
# attributes these files lack, so an upgrade computes its entries again rather than step on a missing one.
MLX_LM = mlx_lm.__version__
_PREFIX = struct.Struct("<6sHII")  # magic, version, header length, header's crc32
_ALIGN = 64
_BLOCK = 4 << 20  # checksummed unit: a 100 MB entry's 25 blocks spread over the checking threads
_MAX_HEADER = 256 << 20  # a length past this is damage, not a header (a million tokens is ~5 MB)
_ZEROS = bytes(_ALIGN)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
_pool: ThreadPoolExecutor | None = None


class DamagedEntry(Exception):
    """The file is missing, truncated, altered, or of another format version: compute the entry instead."""


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _checkers() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(min(4, os.cpu_count() or 1), thread_name_prefix="disk-tier-crc")
    return _pool


def _crc(pieces: list[memoryview]) -> int:
    crc = 0
    for p in pieces:
        crc = zlib.crc32(p, crc)
    return crc


class _Sums:
    """The crc32 of each _BLOCK bytes of a file, fed in pieces of any size in order; on a pool, each block is
    summed on another thread as soon as it is complete (its pieces must then stay unchanged)."""

    def __init__(self, pool: ThreadPoolExecutor | None = None) -> None:
        self.pool = pool
        self.sums: list[int | Future] = []
        self.pieces: list[memoryview] = []
        self.filled = 0

    def room(self) -> int:
        """Bytes until the current block is complete."""
        return _BLOCK - self.filled

    def feed(self, view: memoryview) -> None:
        while view:
            take = min(len(view), self.room())
            self.pieces.append(view[:take])
            self.filled += take
            view = view[take:]
            if self.filled == _BLOCK:
                self._close()

    def _close(self) -> None:
        if self.pieces:
            pieces = self.pieces
            self.sums.append(self.pool.submit(_crc, pieces) if self.pool else _crc(pieces))
        self.pieces, self.filled = [], 0

    def result(self) -> list[int]:
        self._close()
        return [s.result() if isinstance(s, Future) else s for s in self.sums]


def _blocks(n: int) -> int:
    return -(-n // _BLOCK)


def _layout(entry: HostEntry, header: dict) -> tuple[bytes, list[int], int]:
    """(the header's bytes, each array's offset from the data's start, the data's length)."""
    offsets, at = [], 0
    for a in entry.arrays:
        offsets.append(at)
        at = _aligned(at + a.nbytes)
    arrays = [[d, s, o, a.nbytes] for a, d, s, o in zip(entry.arrays, entry.dtypes, entry.shapes, offsets)]
    doc = {"header": header, "layers": entry.layers, "arrays": arrays, "data": at, "mlx_lm": MLX_LM}
    return _encoder.encode(doc), offsets, at


def _sizes(length: int, data: int) -> tuple[int, int]:
    """(where the data starts, the file's length) for a header of length bytes and data bytes of arrays."""
    start = _aligned(_PREFIX.size + length)
    return start, start + data + 4 * _blocks(start + data)


def file_size(entry: HostEntry, header: dict) -> int:
    """The bytes write_file would write."""
    body, _, data = _layout(entry, header)
    return _sizes(len(body), data)[1]


def write_file(path: Path, entry: HostEntry, header: dict) -> int:
    """Write entry under path atomically (0600, its folder 0700); the bytes written. Raises OSError."""
    body, offsets, data = _layout(entry, header)
    start, total = _sizes(len(body), data)
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "wb", buffering=0) as f:
            os.fchmod(f.fileno(), 0o600)  # an existing tmp keeps its mode through O_CREAT
            sums, at = _Sums(), 0

            def put(data: Any, summed: bool = True) -> None:
                nonlocal at
                view = memoryview(data).cast("B")
                if summed:
                    sums.feed(view)
                while view:  # a raw write may write less than asked
                    n = f.write(view)
                    view, at = view[n:], at + n

            put(_PREFIX.pack(MAGIC, VERSION, len(body), zlib.crc32(body)) + body)
            for a, o in zip(entry.arrays, offsets):
                put(_ZEROS[:start + o - at])
                if a.nbytes:
                    put(a)
            put(_ZEROS[:start + data - at])
            put(struct.pack(f"<{_blocks(at)}I", *sums.result()), summed=False)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return total


def _parse_prefix(head: bytes, path: Path) -> tuple[int, int]:
    if len(head) < _PREFIX.size:
        raise DamagedEntry(f"{path}: shorter than its prefix")
    magic, version, length, crc = _PREFIX.unpack_from(head)
    if magic != MAGIC:
        raise DamagedEntry(f"{path}: not a prefix-cache file")
    if version != VERSION:
        raise DamagedEntry(f"{path}: format version {version}, this engine reads {VERSION}")
    if length > _MAX_HEADER:
        raise DamagedEntry(f"{path}: a header of {length} bytes")
    return length, crc


def _parse_header(body: bytes, crc: int, path: Path) -> dict:
    if zlib.crc32(body) != crc:
        raise DamagedEntry(f"{path}: its header fails its checksum")
    try:
        doc = _decoder.decode(body)
    except msgspec.DecodeError as exc:
        raise DamagedEntry(f"{path}: its header does not decode: {exc}") from exc
    if not (isinstance(doc, dict) and isinstance(doc.get("header"), dict) and isinstance(doc.get("data"), int)
            and isinstance(doc.get("layers"), list) and isinstance(doc.get("arrays"), list)):
        raise DamagedEntry(f"{path}: a header without its fields")
    if doc.get("mlx_lm") != MLX_LM:
        raise DamagedEntry(f"{path}: written with mlx-lm {doc.get('mlx_lm')}, this engine runs {MLX_LM}")
    return doc


def _open_doc(f: Any, path: Path) -> tuple[bytes, dict]:
    """(the file's first bytes, its header document), read from f's start."""
    head = f.read(_PREFIX.size)
    length, crc = _parse_prefix(head, path)
    body = f.read(length)
    if len(body) != length:
        raise DamagedEntry(f"{path}: truncated in its header")
    return head + body, _parse_header(body, crc, path)


def read_header(path: Path) -> dict:
    """The dict given to write_file, reading only the file's first bytes; raises DamagedEntry."""
    try:
        with open(path, "rb") as f:
            return _open_doc(f, path)[1]["header"]
    except OSError as exc:
        raise DamagedEntry(f"{path}: {exc.strerror or exc}") from exc


def read_file(path: Path) -> tuple[list[Any], dict]:
    """(the entry's per-layer caches, the dict given to write_file); raises DamagedEntry.

    Each array is made empty first and the file read straight into it (one copy, from the page cache), each
    block checksummed on another thread while the next is read."""
    try:
        with open(path, "rb", buffering=0) as f:
            first, doc = _open_doc(f, path)
            start, total = _sizes(len(first) - _PREFIX.size, doc["data"])
            size = os.fstat(f.fileno()).st_size
            if size != total:
                raise DamagedEntry(f"{path}: {size} bytes where its header says {total}")
            arrays, layout = _empty_arrays(doc, path)
            sums = _Sums(_checkers())
            sums.feed(memoryview(first))

            def into(view: memoryview) -> None:
                while view:  # up to each block's end, so a complete block is checked while the next is read
                    n = f.readinto(view[:sums.room()])
                    if not n:
                        raise DamagedEntry(f"{path}: truncated")
                    sums.feed(view[:n])
                    view = view[n:]

            at = len(first)
            for a, (offset, nbytes) in zip(arrays, layout):
                into(memoryview(bytearray(start + offset - at)))  # the padding: checked like the rest
                if nbytes:
                    into(writable_bytes(a))
                at = start + offset + nbytes
            into(memoryview(bytearray(start + doc["data"] - at)))
            stored = f.read(total - start - doc["data"])
            if stored != struct.pack(f"<{_blocks(start + doc['data'])}I", *sums.result()):
                raise DamagedEntry(f"{path}: fails its checksum")
    except OSError as exc:
        raise DamagedEntry(f"{path}: {exc.strerror or exc}") from exc
    try:
        return restore(doc["layers"], arrays), doc["header"]
    except Unsupported as exc:
        raise DamagedEntry(f"{path}: {exc}") from exc


def _empty_arrays(doc: dict, path: Path) -> tuple[list[mx.array], list[tuple[int, int]]]:
    """The header's arrays made empty and evaluated, and each one's (offset, bytes), in file order."""
    arrays, layout, at = [], [], 0
    try:
        for dtype, shape, offset, nbytes in doc["arrays"]:
            if not (isinstance(offset, int) and isinstance(nbytes, int) and isinstance(dtype, str)):
                raise DamagedEntry(f"{path}: an array's place is not a number")
            a = empty(dtype, shape)
            if a.nbytes != nbytes or offset < at:
                raise DamagedEntry(f"{path}: an array's size or place does not add up")
            arrays.append(a)
            layout.append((offset, nbytes))
            at = offset + nbytes
    except (Unsupported, ValueError, TypeError) as exc:
        raise DamagedEntry(f"{path}: an array the header cannot describe: {exc}") from exc
    if at > doc["data"]:
        raise DamagedEntry(f"{path}: its arrays pass its data")
    mx.eval(arrays)
    return arrays, layout
