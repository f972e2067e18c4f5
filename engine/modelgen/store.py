"""Generated models on disk: written into a cache folder once, found there afterwards."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

DEFAULT_CACHE_DIR = Path("~/.cache/mlx-cluster-serve").expanduser()


def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _is_complete(path: Path, marker_file: str, version: int) -> bool:
    try:
        marker = json.loads((path / marker_file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return marker.get("version") == version


def ensure(target: Path, generate: Callable[[Path], dict], marker_file: str, version: int) -> Path:
    """Return `target`, first calling `generate(tmp)` to write it when it lacks a finished model.

    `generate` writes every file into the empty directory it is given, the marker (`marker_file`,
    holding {"version": version, ...}) last: a directory without it is unfinished and never used.

    Safe when several processes (the local ranks of one host) call it at once: each generates
    into its own temporary directory and renames it into place; the losers, finding the target
    there, throw their copy away. Every copy is identical, so it does not matter who wins.
    """
    if _is_complete(target, marker_file, version):
        return target
    cache_dir = target.parent
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=cache_dir))
    try:
        generate(tmp)
        # Generation runs unlocked (a second of duplicated work at worst); the lock only makes
        # "check, clear a leftover, rename" one step, so no process removes a finished model.
        with open(cache_dir / f".{target.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_complete(target, marker_file, version):
                if target.exists():  # no marker: unfinished, or written by hand
                    shutil.rmtree(target)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
