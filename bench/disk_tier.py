"""The prefix cache's disk tier, files only (engine/diskcache/): how fast an entry comes back from disk against
the disk's plain read rate, what a write costs the step thread (the host copy), and how long rank 0's start-up
takes to read every entry's header. Prints Markdown tables.

An entry of --mb megabytes (bfloat16 KV, 24 layers, as a long prompt on a real model holds) is written once; each
read is timed with the file's pages dropped from the page cache first (posix_fadvise DONTNEED after an fsync:
the disk itself, where the OS honours it) and again warm. The plain read is open + read into bytes; the restore
is read_file: read, checksum every byte, rebuild the caches as MLX arrays. Then --entries small files whose
headers carry --tokens tokens each are scanned as rank 0 does at start-up (DiskTier(...) then scan()).

    .venv/bin/python -m bench.disk_tier [--dir /tmp/disk-bench] [--mb 100] [--entries 10000] [--tokens 4096]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import tempfile
import time
import zlib
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine.diskcache.files import host_copy, read_file, write_file
from engine.diskcache.identity import pack_tokens
from engine.diskcache.structure import empty
from engine.diskcache.tier import DiskTier

LAYERS, HEADS, DIM = 24, 8, 128


def entry(mb: int) -> list[KVCache]:
    """KV of LAYERS layers in bfloat16, about mb megabytes in all."""
    tokens = max(1, mb * 10**6 // (LAYERS * 2 * HEADS * DIM * 2))
    out = []
    for i in range(LAYERS):
        c = KVCache()
        k = mx.random.normal((1, HEADS, tokens, DIM), key=mx.random.key(i)).astype(mx.bfloat16)
        c.keys, c.values, c.offset = k, -k, tokens
        out.append(c)
    mx.eval([a for c in out for a in (c.keys, c.values)])
    return out


def drop(path: Path) -> None:
    """The file's pages out of the page cache (clean pages only: hence the fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn, path: Path, runs: int, cold: bool) -> float:
    """Median seconds of fn(path) over runs."""
    times = []
    for _ in range(runs):
        if cold:
            drop(path)
        start = time.perf_counter()
        fn(path)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def plain_read(path: Path) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def checksums(mb: int) -> list[tuple[str, float]]:
    data = os.urandom(mb * 10**6)
    out = []
    for name, fn in (("blake2b", lambda: hashlib.blake2b(data).digest()), ("sha256", lambda: hashlib.sha256(data)
                     .digest()), ("crc32", lambda: zlib.crc32(data)), ("memcpy", lambda: bytearray(data))):
        start = time.perf_counter()
        fn()
        out.append((name, len(data) / (time.perf_counter() - start) / 1e9))
    return out


def scan_table(folder: Path, entries: int, tokens: int, packed: bool) -> list[tuple[str, float, float]]:
    """Seconds to index the folder and to read every header, page cache cold and warm."""
    host = host_copy(entry(0)[:1])  # a few KB of KV: a scan reads headers only
    for i in range(entries):
        ids = list(range(i, i + tokens))
        header = {"tokens": pack_tokens(ids) if packed else ids, "tenant": "", "length": tokens}
        write_file(folder / f"{i:040x}.kv", host, header)
    rows = []
    for cold in (True, False):
        if cold:
            for p in folder.iterdir():
                drop(p)
        start = time.perf_counter()
        tier = DiskTier(folder, 1 << 40)
        index = time.perf_counter() - start
        n = sum(1 for _ in tier.scan())
        total = time.perf_counter() - start
        tier.close()
        assert n == entries
        rows.append(("cold" if cold else "warm", index, total))
    shutil.rmtree(folder)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, default=None, help="where to write (default: a temp folder)")
    ap.add_argument("--mb", type=int, default=100)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--entries", type=int, default=10000)
    ap.add_argument("--tokens", type=int, default=4096)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="disk-bench-", dir=args.dir))
    try:
        layers = entry(args.mb)
        copy_s, view_s = (timed(lambda _: host_copy(layers, copy), root, args.runs, cold=False) for copy in (True, False))
        host = host_copy(layers)
        path = root / "big.kv"
        start = time.perf_counter()
        size = write_file(path, host, {"tokens": list(range(4096)), "tenant": "", "length": 4096})
        write_s = time.perf_counter() - start
        gb = size / 1e9
        print(f"entry: {size / 1e6:.1f} MB in {LAYERS} layers (bfloat16); the step thread's part of a write: "
              f"host_copy {copy_s * 1e3:.1f} ms ({gb / copy_s:.2f} GB/s), host_copy(copy=False) {view_s * 1e3:.2f} ms; "
              f"write_file {gb / write_s:.2f} GB/s\n")
        print("| read | page cache | GB/s | of plain read |\n|---|---|---|---|")
        for cold in (True, False):
            plain = gb / timed(plain_read, path, args.runs, cold)
            restore = gb / timed(read_file, path, args.runs, cold)
            where = "dropped" if cold else "warm"
            print(f"| plain read (bytes) | {where} | {plain:.2f} | 1.00 |")
            print(f"| read_file (checksum + MLX arrays) | {where} | {restore:.2f} | {restore / plain:.2f} |")
        made = timed(lambda _: mx.eval([empty(d, s) for d, s in zip(host.dtypes, host.shapes)]), root, args.runs, False)
        print(f"\nof which the entry's empty arrays (made and evaluated before the read fills them): {made * 1e3:.1f} ms")
        print("\n| checksum on " + f"{args.mb} MB | GB/s |\n|---|---|")
        for name, rate in checksums(args.mb):
            print(f"| {name} | {rate:.2f} |")
        print(f"\n| scan of {args.entries} entries, {args.tokens} tokens each | page cache | index (names, sizes) s "
              "| + every header s |\n|---|---|---|---|")
        for packed in (False, True):
            form = "tokens packed (identity.pack_tokens)" if packed else "tokens a msgpack list of ints"
            for where, index, total in scan_table(root / "scan", args.entries, args.tokens, packed):
                print(f"| {form} | {where} | {index:.2f} | {total:.2f} |")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
