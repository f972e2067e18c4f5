"""The names that key the disk tier: PROMPT_CACHE_DIR / model identity / layout / precision / entry name.

Each part names something that would make a reuse wrong: other weights (a digest of their content, never the
model's name: a folder re-downloaded or converted again under the same name may differ), another split of the
model over the ranks or this rank's part of it, another KV precision, another tenant or other tokens.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from engine.parallel import PIPELINE, TENSOR, stage_layers

log = logging.getLogger(__name__)

WEIGHTS = ("*.safetensors", "*.gguf", "*.npz")
CONFIG = "config.json"  # the architecture the weights are read with (a rope scaling changes every key)
SIDECAR = "model-identities.json"
# a Hugging Face cache's LFS blob is named by its content's sha256 (a small file's by git's sha1, which is not the
# content's sha256: those are read, they are small), so a snapshot and a plain copy of it get the same identity
_BLOB = re.compile(r"[0-9a-f]{64}")
_CHUNK = 8 << 20


def _files(model_dir: Path) -> list[Path]:
    weights = sorted({p for pattern in WEIGHTS for p in model_dir.glob(pattern)})
    config = model_dir / CONFIG
    return weights + [config] if weights and config.exists() else weights


def _blob(path: Path) -> str | None:
    """The content's sha256 that a Hub cache's snapshot link names (its blob's file name), without reading it."""
    if not path.is_symlink():
        return None
    target = path.resolve()
    return target.name if target.parent.name == "blobs" and _BLOB.fullmatch(target.name) else None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        for block in iter(lambda: f.read(_CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def _key(path: Path) -> str:
    """Size and mtime alone miss weights replaced by a copy that kept its source's mtime (rsync -a, cp -p): a new
    file has another inode, and a rename or write sets ctime, which no copy tool can carry over."""
    st = path.stat()
    return f"{path.resolve()}|{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_ctime_ns}"


def _load_sidecar(path: Path) -> dict[str, str]:
    try:
        known = json.loads(path.read_text())
        return {k: v for k, v in known.items() if isinstance(k, str) and isinstance(v, str)}
    except (OSError, ValueError, AttributeError):
        return {}


def _save_sidecar(path: Path, known: dict[str, str]) -> None:
    """Atomically, 0600 (it names the model's files)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(known, f, indent=0, sort_keys=True)
    os.replace(tmp, path)


def model_identity(model_dir: Path, cache_dir: Path | None = None) -> str | None:
    """A digest of the model's weights (and config.json), or None when the folder holds no weights or a file
    cannot be read.

    Files linked into a Hugging Face cache's blobs/ are named by their content's hash: those names are digested,
    free. Any other file's content is hashed once (minutes for a large model: call this from a background thread,
    never where serving waits) and remembered in cache_dir's sidecar by (path, size, mtime_ns, inode, ctime_ns)."""
    files = _files(model_dir)
    if not files:
        return None
    sidecar = cache_dir / SIDECAR if cache_dir is not None else None
    known = _load_sidecar(sidecar) if sidecar is not None else {}
    parts, learned = [], False
    try:
        for path in files:
            blob = _blob(path)
            if blob is None:
                key = _key(path)
                if key not in known:
                    known[key], learned = _sha256(path), True
                blob = known[key]
            parts.append([path.name, blob])
    except OSError as exc:
        log.warning("the prefix cache's disk tier stays off: the weights of %s cannot be read (%s)", model_dir, exc)
        return None
    if learned and sidecar is not None:
        try:
            _save_sidecar(sidecar, known)
        except OSError as exc:  # the digest stands; opening the tier's folder there fails next, and says so
            log.debug("model identities not remembered in %s: %s", sidecar, exc)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:32]


def layout_name(ranks: int, rank: int, parallel: str, layers: Sequence[int] = ()) -> str:
    """This rank's part of the model: "r0" alone, "tp2.r1" for a tensor-parallel slice, "pp2.r0.L12-23" for a
    pipeline stage (layers: each rank's count of layers, rank 0 first, as mlx-lm's pipeline() takes them; rank 0
    holds the last layers)."""
    if ranks <= 1:
        return f"r{rank}"
    if parallel == TENSOR:
        return f"tp{ranks}.r{rank}"
    if parallel == PIPELINE:
        held = stage_layers(list(layers), rank)
        return f"pp{ranks}.r{rank}.L{held.start}-{held.stop - 1}"
    raise ValueError(f"no layout name for {parallel!r} on {ranks} ranks")


def precision_name(kv_bits: int | None, group: int) -> str:
    """The KV precision entries are stored in: "full" (the model's dtype, which its identity covers) or "q8g64"."""
    return f"q{kv_bits}g{group}" if kv_bits else "full"


def pack_tokens(tokens: Iterable[int]) -> bytes:
    """Token ids as 4 bytes each: a header's tokens in this form decode as one copy, where a msgpack list of ints
    makes a Python int per token (a scan of 10,000 headers: bench/README.md)."""
    return np.asarray(list(tokens), dtype="<u4").tobytes()


def unpack_tokens(data: bytes) -> list[int]:
    return np.frombuffer(data, dtype="<u4").tolist()


def entry_name(tenant: str, tokens: Iterable[int]) -> str:
    """The file name (without suffix) of the entry of these tokens for this tenant: a digest of both."""
    salt = tenant.encode()
    h = hashlib.sha256(len(salt).to_bytes(8, "little") + salt)
    h.update(pack_tokens(tokens))
    return h.hexdigest()[:40]
