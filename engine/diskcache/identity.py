"""Keys of the disk tier (stand-in): what would make a file's reuse wrong names its folder or its file."""

from __future__ import annotations

import hashlib
import os
import struct
from pathlib import Path


def model_identity(model_dir) -> str:
    """A digest of the weight files (stand-in: their names, sizes and mtimes)."""
    h = hashlib.sha256()
    for p in sorted(Path(model_dir).resolve().rglob("*")):
        if p.is_file() and p.suffix in (".safetensors", ".gguf", ".npz"):
            st = os.stat(p)
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return h.hexdigest()[:32]


def layout_name(parallel: str, rank: int, size: int, layers: list[int] = ()) -> str:
    if size <= 1:
        return "r0"
    if parallel == "pipeline":
        return f"pp{size}.r{rank}." + "-".join(map(str, layers))
    return f"tp{size}.r{rank}"


def precision_name(kv_bits: int | None, group: int) -> str:
    return f"q{kv_bits}g{group}" if kv_bits else "model"


def entry_name(tenant: str, tokens: list[int]) -> str:
    h = hashlib.blake2b(tenant.encode() + b"\0", digest_size=20)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.hexdigest()
