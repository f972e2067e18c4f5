"""Models in a Hugging Face cache folder, and the manifest that says one is whole.

Standard library only: ops/hostprobe.py runs this file (by path) on hosts where the project may be
missing or broken, and the API reads it without MLX.

The cache has huggingface_hub's layout, so a model downloaded by any Hugging Face tool is found too:

    CACHE/models--ORG--NAME/blobs/...            the files' bytes
    CACHE/models--ORG--NAME/refs/REVISION        the commit a branch or tag pointed to
    CACHE/models--ORG--NAME/snapshots/COMMIT/... the files by name (links into blobs/, or plain files)

and one file of ours beside them, written last, once every file is present and its sha256 checked:

    CACHE/models--ORG--NAME/mcs-manifests/COMMIT.json
        {"repo": "org/name", "revision": "main", "commit": "<commit>",
         "files": [{"path": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...]}

So a manifest's presence on a host means "this host received the whole model and checked it", and
`complete` below only has to stat: every listed file there, with its size.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

MANIFESTS = "mcs-manifests"
HASH_CHUNK = 8 * 1024 * 1024
# org/name as the Hugging Face hub spells a repo id (what a local path or a demo/zoo name is not)
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
# a blob's name in the cache: git's sha1 of a small file, the sha256 of an LFS one
_BLOB_RE = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")


def default_hub_cache() -> Path:
    """huggingface_hub's own cache folder: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or "~/.cache/huggingface"
    return Path(home).expanduser() / "hub"


def is_repo_id(name: str) -> bool:
    return bool(_REPO_RE.match(name)) and ".." not in name


def is_commit(name: str) -> bool:
    return bool(_COMMIT_RE.match(name))


def is_blob_name(name: str) -> bool:
    return bool(_BLOB_RE.match(name))


def inside_path(path: str) -> bool:
    """A file's path as a snapshot may hold it: relative, with / separators, no part that climbs out or is empty."""
    parts = path.split("/")
    return bool(path) and "\0" not in path and all(part not in ("", ".", "..") for part in parts)


def repo_folder(cache: Path, repo: str) -> Path:
    return cache / ("models--" + repo.replace("/", "--"))


def repo_of_folder(folder: Path) -> str | None:
    """models--ORG--NAME -> ORG/NAME (None for anything else in the cache)."""
    name = folder.name
    if not name.startswith("models--") or name.count("--") < 2:
        return None
    org, _, rest = name[len("models--"):].partition("--")
    return f"{org}/{rest}"


@dataclass(frozen=True)
class ManifestFile:
    path: str  # relative to the snapshot folder, with / separators
    size: int
    sha256: str


@dataclass(frozen=True)
class Manifest:
    repo: str
    revision: str  # as asked (a branch, a tag or a commit)
    commit: str  # the commit it resolved to: the snapshot folder's name
    files: tuple[ManifestFile, ...] = ()

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)

    def to_json(self) -> str:
        doc = asdict(self)
        doc["files"] = [asdict(f) for f in self.files]
        return json.dumps(doc, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Raises ValueError when the text is not a manifest."""
        try:
            doc = json.loads(text)
            files = tuple(ManifestFile(path=str(f["path"]), size=int(f["size"]), sha256=str(f["sha256"]))
                          for f in doc["files"])
            manifest = cls(repo=str(doc["repo"]), revision=str(doc["revision"]), commit=str(doc["commit"]),
                           files=files)
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as exc:
            raise ValueError(f"not a model manifest ({type(exc).__name__}: {exc})") from None
        # the commit and the sha256s name folders and files in the cache: none may climb out of it
        if manifest.commit and not is_commit(manifest.commit):
            raise ValueError(f"not a model manifest: commit {manifest.commit!r} is not 40 hex digits")
        for f in files:
            if not inside_path(f.path) or f.size < 0 or len(f.sha256) != 64 or not is_blob_name(f.sha256):
                raise ValueError(f"not a model manifest: file {f.path!r} of size {f.size} (sha256 {f.sha256!r}) "
                                 "is outside its folder or malformed")
        return manifest


def manifest_path(cache: Path, repo: str, commit: str) -> Path:
    return repo_folder(cache, repo) / MANIFESTS / f"{commit}.json"


def snapshot_folder(cache: Path, repo: str, commit: str) -> Path:
    return repo_folder(cache, repo) / "snapshots" / commit


def commit_of(cache: Path, repo: str, revision: str = "main") -> str | None:
    """The commit a revision names in this cache: itself when it is one, else what refs/REVISION says."""
    if _COMMIT_RE.match(revision):
        return revision
    ref = repo_folder(cache, repo) / "refs" / revision
    try:
        commit = ref.read_text().strip()
    except OSError:
        return None
    return commit if _COMMIT_RE.match(commit) else None


def read_manifest(cache: Path, repo: str, revision: str = "main") -> Manifest | None:
    commit = commit_of(cache, repo, revision)
    if commit is None:
        return None
    try:
        return Manifest.from_json(manifest_path(cache, repo, commit).read_text())
    except (OSError, ValueError):
        return None


def write_manifest(cache: Path, manifest: Manifest) -> Path:
    """Atomically (a reader sees the old file or the whole new one), with refs/REVISION pointing at the commit."""
    folder = repo_folder(cache, manifest.repo)
    if manifest.revision != manifest.commit:
        _write_atomic(folder / "refs" / manifest.revision, manifest.commit)
    path = manifest_path(cache, manifest.repo, manifest.commit)
    _write_atomic(path, manifest.to_json())
    return path


def _write_atomic(path: Path, text: str) -> None:
    try:
        if path.read_text() == text:
            return  # a re-run of a whole download touches nothing
    except (OSError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def sha256_file(path: Path, chunk: int = HASH_CHUNK) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def missing_files(cache: Path, manifest: Manifest) -> list[str]:
    """The manifest's files absent from this cache's snapshot or of another size (stat only, no hashing)."""
    snap = snapshot_folder(cache, manifest.repo, manifest.commit)
    out = []
    for f in manifest.files:
        try:
            if (snap / f.path).stat().st_size != f.size:
                out.append(f.path)
        except OSError:
            out.append(f.path)
    return out


@dataclass
class CachedModel:
    """One model as a host's cache holds it (from stat alone)."""

    repo: str
    commit: str
    revisions: list[str] = field(default_factory=list)  # the refs that point at this commit
    size: int = 0  # bytes present
    total: int = 0  # bytes of the whole model (the manifest's), or what is present without one
    complete: bool = False  # our manifest is there and every file it lists is present with its size
    manifest: bool = False  # False: no check against the hub's hashes recorded (another tool's, or a failed one)
    missing: list[str] = field(default_factory=list)


def scan(cache: Path) -> list[CachedModel]:
    """Every model snapshot in a cache folder, by repo then commit."""
    out: list[CachedModel] = []
    try:
        folders = sorted(p for p in cache.iterdir() if p.is_dir())
    except OSError:
        return out
    for folder in folders:
        repo = repo_of_folder(folder)
        if repo is None:
            continue
        refs = _refs(folder)
        try:
            snapshots = sorted(p for p in (folder / "snapshots").iterdir() if p.is_dir())
        except OSError:
            snapshots = []
        for snap in snapshots:
            out.append(_cached(cache, repo, snap, [r for r, c in refs.items() if c == snap.name]))
    return out


def _refs(folder: Path) -> dict[str, str]:
    refs: dict[str, str] = {}
    base = folder / "refs"
    if base.is_dir():
        for ref in base.rglob("*"):
            if ref.is_file():
                try:
                    refs[str(ref.relative_to(base))] = ref.read_text().strip()
                except OSError:
                    continue
    return refs


def _cached(cache: Path, repo: str, snap: Path, revisions: list[str]) -> CachedModel:
    model = CachedModel(repo=repo, commit=snap.name, revisions=sorted(revisions))
    try:
        manifest = Manifest.from_json(manifest_path(cache, repo, snap.name).read_text())
    except (OSError, ValueError):
        manifest = None
    if manifest is not None:
        model.manifest = True
        model.total = manifest.total_bytes
        model.missing = missing_files(cache, manifest)
        present = {f.path: f.size for f in manifest.files if f.path not in model.missing}
        model.size = sum(present.values())
        model.complete = not model.missing
        return model
    # no manifest: another tool's download, or one of ours that failed; nothing says its bytes are the hub's
    # (`download` checks them against the hub's hashes, moving nothing when they match, and writes the manifest)
    files = [p for p in snap.rglob("*") if p.is_file()]
    model.size = model.total = sum(_size(p) for p in files)
    return model


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def find_snapshot(cache: Path, repo: str, revision: str = "main") -> Path | None:
    """The folder a rank loads a repo id from: the revision's snapshot, when it holds config.json."""
    commit = commit_of(cache, repo, revision)
    if commit is None:
        return None
    snap = snapshot_folder(cache, repo, commit)
    return snap if (snap / "config.json").is_file() else None


def split_model(name: str) -> tuple[str, str] | None:
    """MODEL as ORG/NAME or ORG/NAME@REVISION -> (repo, revision); None for a local path or a demo/zoo name."""
    repo, _, revision = name.partition("@")
    if not is_repo_id(repo) or (revision and not _REPO_RE.match("r/" + revision)):
        return None
    return repo, revision or "main"


def locate(cache: Path, repo: str, revision: str = "main") -> tuple[Path | None, str]:
    """(the snapshot a rank loads, "") or (None, what this cache lacks, in words the engine and `check` share)."""
    commit = commit_of(cache, repo, revision)
    if commit is None:
        return None, f"{repo} ({revision}) is not in the Hugging Face cache {cache}"
    manifest = read_manifest(cache, repo, commit)
    if manifest is not None and (missing := missing_files(cache, manifest)):
        shown = ", ".join(missing[:3]) + (", ..." if len(missing) > 3 else "")
        return None, (f"{repo} is incomplete in {cache}: {len(missing)} of {len(manifest.files)} file(s) missing "
                      f"or short ({shown})")
    snap = find_snapshot(cache, repo, commit)
    if snap is None:
        return None, f"{repo} ({revision}) has no config.json in {snapshot_folder(cache, repo, commit)}"
    return snap, ""
