"""One cache folder receiving a model (a spread): what it holds already, and writing what arrives.

No MLX here (unit-tested directly). Files land in huggingface_hub's layout: the bytes in
`blobs/<sha256>` and `snapshots/COMMIT/<path>` a relative link to it, as huggingface_hub itself
leaves them (its blobs of large files are named by their sha256 too). Bytes arrive into
`blobs/<sha256>.incomplete` (the name huggingface_hub gives its own partial downloads, so a listing
sees a partial model), which survives a killed spread: the next one resumes from its length.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from config.hub_cache import HASH_CHUNK, Manifest, repo_folder, snapshot_folder, write_manifest

COMPLETE = -1  # "have" of a blob a rank holds whole and checked


@dataclass(frozen=True)
class Item:
    """One blob: the bytes of every manifest path with this sha256 (a model rarely has two)."""

    sha256: str
    size: int
    paths: tuple[str, ...]


def items(manifest: Manifest) -> list[Item]:
    """The manifest's blobs in its file order."""
    by_sha: dict[str, list[str]] = {}
    sizes: dict[str, int] = {}
    for f in manifest.files:
        by_sha.setdefault(f.sha256, []).append(f.path)
        sizes[f.sha256] = f.size
    return [Item(sha, sizes[sha], tuple(paths)) for sha, paths in by_sha.items()]


def free_bytes(folder: Path) -> int:
    """Free bytes on the disk that holds folder (or would: its nearest existing parent)."""
    probe = folder
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    return shutil.disk_usage(probe).free


def _hash(path: Path, limit: int | None = None) -> hashlib._Hash:
    h = hashlib.sha256()
    left = limit
    with open(path, "rb") as f:
        while left is None or left > 0:
            block = f.read(HASH_CHUNK if left is None else min(HASH_CHUNK, left))
            if not block:
                break
            h.update(block)
            if left is not None:
                left -= len(block)
    return h


@dataclass
class RankStore:
    """A rank's cache folder for one manifest."""

    cache: Path
    manifest: Manifest
    partial: dict[str, hashlib._Hash] = field(default_factory=dict)  # sha256 -> hash of the partial's bytes

    @property
    def blobs(self) -> Path:
        return repo_folder(self.cache, self.manifest.repo) / "blobs"

    @property
    def snapshot(self) -> Path:
        return snapshot_folder(self.cache, self.manifest.repo, self.manifest.commit)

    def incomplete(self, item: Item) -> Path:
        return self.blobs / f"{item.sha256}.incomplete"

    def sizes_only(self, item: Item) -> bool:
        """Every path of the item present with its size (what rank 0, the source, checks of itself)."""
        return all(_size(self.snapshot / p) == item.size for p in item.paths)

    def have(self, item: Item) -> int:
        """COMPLETE when every path of the item holds its bytes (size, then sha256), else how many bytes
        of it a partial from an earlier spread already holds (its hash kept for the rest to extend)."""
        if self.sizes_only(item):
            real = {os.path.realpath(self.snapshot / p) for p in item.paths}
            if all(_hash(Path(r)).hexdigest() == item.sha256 for r in real):
                return COMPLETE
        blob = self.blobs / item.sha256
        if _size(blob) == item.size and _hash(blob).hexdigest() == item.sha256:
            self.link(item)  # the bytes are here (a dropped link, or a path sharing a blob): no need to move them
            return COMPLETE
        part = self.incomplete(item)
        held = _size(part)
        if held <= 0 or held > item.size:
            part.unlink(missing_ok=True)
            return 0
        h = _hash(part, held)
        if held == item.size:
            if h.hexdigest() == item.sha256:
                self.finish(item, h)
                return COMPLETE
            part.unlink()
            return 0
        self.partial[item.sha256] = h
        return held

    def link(self, item: Item) -> None:
        """Point every path of the item at its blob (replacing whatever stood there, atomically)."""
        blob = self.blobs / item.sha256
        for p in item.paths:
            dest = self.snapshot / p
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.parent / f".{dest.name}.link"
            tmp.unlink(missing_ok=True)
            tmp.symlink_to(os.path.relpath(blob, dest.parent))
            os.replace(tmp, dest)

    def finish(self, item: Item, h: hashlib._Hash) -> bool:
        """The partial is whole: keep it when its sha256 is the manifest's (True), else drop it."""
        part = self.incomplete(item)
        if h.hexdigest() != item.sha256:
            part.unlink(missing_ok=True)
            return False
        os.replace(part, self.blobs / item.sha256)
        self.link(item)
        return True


class Incoming:
    """One blob arriving: bytes from `held` on are appended to its partial and hashed as they come."""

    def __init__(self, store: RankStore, item: Item, held: int):
        self.store, self.item, self.held = store, item, held
        self.hash = store.partial.pop(item.sha256, None) if held else None
        if self.hash is None:
            self.hash, self.held = hashlib.sha256(), 0
        store.blobs.mkdir(parents=True, exist_ok=True)
        # unbuffered: what was written is on disk when the spread is killed, for the next one to resume from
        self.file = open(store.incomplete(item), "r+b" if self.held else "wb", buffering=0)
        self.file.truncate(self.held)
        self.file.seek(self.held)

    def write(self, pos: int, data: memoryview) -> None:
        """The item's bytes [pos, pos + len(data)); what this rank holds already is skipped."""
        end = pos + len(data)
        if end <= self.held:
            return
        part = data[self.held - pos:] if pos < self.held else data
        self.file.write(part)
        self.hash.update(part)
        self.held = end

    def close(self) -> bool:
        """True when the whole blob arrived with the manifest's sha256 and is in place."""
        self.file.close()
        return self.held == self.item.size and self.store.finish(self.item, self.hash)


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return -1


def survey(cache: Path, manifest: Manifest) -> dict:
    """What this cache lacks of the manifest: {"free": bytes, "need": bytes, "lacking": [paths]} (partials kept)."""
    store = RankStore(cache, manifest)
    need, lacking = 0, []
    for item in items(manifest):
        held = store.have(item)
        if held != COMPLETE:
            need += item.size - held
            lacking += item.paths
    return {"free": free_bytes(cache), "need": need, "lacking": lacking}


def verify(cache: Path, manifest: Manifest, write: bool) -> dict:
    """{"bad": [paths]}: paths absent or damaged, the damaged ones removed so a copy replaces them; with write
    and none bad, the manifest is written (last)."""
    store = RankStore(cache, manifest)
    bad: list[str] = []
    for item in items(manifest):
        if store.have(item) == COMPLETE:
            continue
        bad += item.paths
        for p in item.paths:
            target = store.snapshot / p
            if target.exists() and _size(target) == item.size:  # the right size with the wrong bytes
                real = Path(os.path.realpath(target))
                # a blob of ours goes; a link to anywhere else (made by hand or another tool) goes, not its file
                (real if real.parent == Path(os.path.realpath(store.blobs)) else target).unlink()
    if write and not bad:
        write_manifest(cache, manifest)
    return {"bad": bad}


def main(argv: list[str] | None = None) -> int:
    """`python -m config.hub_store survey|verify|commit CACHE < MANIFEST_JSON`: one JSON line on stdout (the rsync
    transport of a spread runs it on each host over ssh)."""
    import json
    import sys

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in ("survey", "verify", "commit"):
        print("usage: python -m config.hub_store survey|verify|commit CACHE < MANIFEST_JSON", file=sys.stderr)
        return 2
    manifest = Manifest.from_json(sys.stdin.read())
    cache = Path(args[1]).expanduser()
    out = survey(cache, manifest) if args[0] == "survey" else verify(cache, manifest, write=args[0] == "commit")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
