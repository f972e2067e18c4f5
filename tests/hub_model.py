"""A zoo model in a Hugging Face cache folder with its manifest, as a download leaves it: the floor of the
spreading tests (tests/multirank/test_spread.py, tests/integration/test_spread_rsync.py)."""

from __future__ import annotations

import json
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


def hub_shaped(zoo: Path, dest: Path, shards: int = 3, copies: tuple[str, ...] = ()) -> Path:
    """A zoo model laid out as a repo on the hub holds one: its weights in `shards` safetensors files with
    model.safetensors.index.json, a .gitattributes naming what LFS stores, a README.md; each path in copies
    holds the same bytes as tokenizer.json (repos ship duplicates, e.g. under original/)."""
    dest.mkdir(parents=True)
    for f in zoo.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copyfile(f, dest / f.name)
    raw = (zoo / "model.safetensors").read_bytes()
    length = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + length])
    data = raw[8 + length:]
    names = sorted(k for k in header if k != "__metadata__")
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part, body = {"__metadata__": header.get("__metadata__", {"format": "mlx"})}, bytearray()
        for key in names[i::shards]:
            start, end = header[key]["data_offsets"]
            part[key] = {**header[key], "data_offsets": [len(body), len(body) + end - start]}
            body += data[start:end]
            weight_map[key] = name
        text = json.dumps(part).encode()
        (dest / name).write_bytes(len(text).to_bytes(8, "little") + text + bytes(body))
    (dest / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": len(data)}, "weight_map": dict(sorted(weight_map.items()))}, indent=2))
    (dest / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
                                         "*.bin filter=lfs diff=lfs merge=lfs -text\n")
    (dest / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny\nRandom weights for tests.\n")
    for copy in copies:
        (dest / copy).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(dest / "tokenizer.json", dest / copy)
    return dest
