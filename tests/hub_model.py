"""A zoo model in a Hugging Face cache folder with its manifest, as a download leaves it: the floor of the
spreading tests (tests/multirank/test_spread.py, tests/integration/test_spread_rsync.py)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from config.hub_cache import Manifest, ManifestFile, repo_folder, sha256_file, snapshot_folder, write_manifest
from engine.zoo.store import ensure_zoo_model
from tests.harness import MODEL_CACHE

REPO_ID = "org/tiny-zoo"
COMMIT = "c0ffee" + "0" * 34


def hub_model(cache: Path, links: bool = False) -> Manifest:
    """The llama zoo model under cache as REPO_ID at COMMIT; with links, its files are links into blobs/ named
    by sha256 (huggingface_hub's own layout), else plain files in the snapshot."""
    src = ensure_zoo_model("llama", MODEL_CACHE)
    snap = snapshot_folder(cache, REPO_ID, COMMIT)
    blobs = repo_folder(cache, REPO_ID) / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir(parents=True)
    files = []
    for f in sorted(p for p in src.iterdir() if p.is_file()):
        sha = sha256_file(f)
        if links:
            shutil.copyfile(f, blobs / sha)
            (snap / f.name).symlink_to(os.path.relpath(blobs / sha, snap))
        else:
            shutil.copyfile(f, snap / f.name)
        files.append(ManifestFile(f.name, f.stat().st_size, sha))
    manifest = Manifest(REPO_ID, "main", COMMIT, tuple(files))
    write_manifest(cache, manifest)
    return manifest


def identical(r0: Path, r1: Path, manifest: Manifest) -> bool:
    """Every file of the manifest in both caches, with the manifest's sha256."""
    a, b = snapshot_folder(r0, REPO_ID, COMMIT), snapshot_folder(r1, REPO_ID, COMMIT)
    return all(sha256_file(b / f.path) == sha256_file(a / f.path) == f.sha256 for f in manifest.files)


def flip_a_byte(path: Path) -> None:
    """One bit of the file behind path changed, its size and time kept (bit rot): only a sha256 tells."""
    real = Path(os.path.realpath(path))
    before = real.stat()
    data = bytearray(real.read_bytes())
    data[len(data) // 2] ^= 0x01
    real.write_bytes(bytes(data))
    os.utime(real, ns=(before.st_atime_ns, before.st_mtime_ns))
