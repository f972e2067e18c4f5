"""Fetch a repo's files from the Hugging Face hub into huggingface_hub's cache layout, resuming byte-exactly.

huggingface_hub 2.4 writes each file to a process-unique temporary name and deletes it when the download
fails, so a download killed half-way starts every unfinished file over: hours for a 600 GB model. Here a
file grows in blobs/ETAG.incomplete, a rerun asks the hub only for the bytes it lacks (an HTTP Range), and
the finished blob is checked against the hub's hashes, then renamed over whatever stood there and linked from
snapshots/COMMIT/ as huggingface_hub links it, so every Hugging Face tool (mlx-lm too) reads the result and a
served model never loses a file it had. huggingface_hub still does the talking: the endpoint (HF_ENDPOINT),
the token (HF_TOKEN), the headers, redirects to the CDN, and the errors it raises for the hub's answers.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from config.hub_cache import inside_path, is_blob_name, is_commit, repo_folder, snapshot_folder

ATTEMPTS = 5  # per file; each resumes where the previous one stopped


class HubAnswerRefused(ValueError):
    """The hub's listing names a commit, file or blob that would land outside the cache (or is no hub name)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    etag: str  # the blob's name in the cache: the LFS sha256, else the git blob id (as huggingface_hub names it)
    sha256: str | None = None  # LFS files: what the hub says the bytes hash to
    blob_id: str | None = None  # git's blob id: of the bytes for a regular file, of its pointer for an LFS one


@dataclass(frozen=True)
class RemoteRepo:
    repo: str
    revision: str
    commit: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def endpoint() -> str:
    from huggingface_hub import constants
    return constants.ENDPOINT


def list_repo(repo: str, revision: str) -> RemoteRepo:
    """The commit a revision names and every file with its size and hashes (one API call); raises
    HubAnswerRefused when one of them could not be a path inside the cache (a broken or hostile mirror)."""
    from huggingface_hub import HfApi
    info = HfApi().model_info(repo, revision=revision, files_metadata=True)
    # every name below becomes a path on disk: each is checked before any byte moves
    if not is_commit(str(info.sha)):
        raise HubAnswerRefused(f"commit {str(info.sha)[:80]!r}, which is not 40 hex digits")
    files = []
    for s in info.siblings or []:
        sha256 = s.lfs.sha256 if s.lfs is not None else None
        size = s.lfs.size if s.lfs is not None else s.size
        etag = sha256 or s.blob_id
        if size is None or etag is None:
            raise HubAnswerRefused(f"no size or id for {s.rfilename!r}")
        if not inside_path(str(s.rfilename)):
            raise HubAnswerRefused(f"a file named {str(s.rfilename)[:200]!r}, which would land outside the model's "
                                   "folder")
        if not all(h is None or is_blob_name(h) for h in (etag, sha256, s.blob_id)):
            raise HubAnswerRefused(f"{s.rfilename!r} with the id {str(etag)[:80]!r}, which is no sha1 or sha256")
        files.append(RemoteFile(s.rfilename, int(size), etag, sha256, s.blob_id))
    return RemoteRepo(repo, revision, str(info.sha), tuple(files))


def verifies(f: RemoteFile, sha256: str, blob_id: str) -> bool:
    """Whether bytes with these hashes are f: by the hub's lfs.sha256 when it gives one, else by git's blob id
    (the blobId of an LFS file is its pointer's, never its content's)."""
    return sha256 == f.sha256 if f.sha256 else blob_id == f.blob_id


@dataclass(frozen=True)
class Blob:
    """The bytes of every path of a repo with one etag: fetched once, linked from each path."""

    etag: str
    files: tuple[RemoteFile, ...]

    @property
    def size(self) -> int:
        return self.files[0].size


def blobs(remote: RemoteRepo) -> list[Blob]:
    """The repo's files grouped by etag, in listing order (two paths with the same content share one blob)."""
    by_etag: dict[str, list[RemoteFile]] = {}
    for f in remote.files:
        by_etag.setdefault(f.etag, []).append(f)
    return [Blob(etag, tuple(files)) for etag, files in by_etag.items()]


class BadBytes(OSError):
    """A fetched file whose bytes are not the ones the hub's hashes name (dropped, never linked)."""

    def __init__(self, path: str, overflowed: bool):
        super().__init__(f"{path} differs from the hub's hashes")
        self.path, self.overflowed = path, overflowed


def blob_path(cache: Path, repo: str, etag: str) -> Path:
    return repo_folder(cache, repo) / "blobs" / etag


def partial_path(cache: Path, repo: str, etag: str) -> Path:
    return blob_path(cache, repo, etag).with_name(etag + ".incomplete")


def pointer_path(cache: Path, remote: RemoteRepo, f: RemoteFile) -> Path:
    return snapshot_folder(cache, remote.repo, remote.commit) / f.path


def partial_bytes(cache: Path, repo: str, blob: Blob) -> int:
    """What an earlier run left of the blob that a fetch resumes from (a partial longer than the file is not)."""
    try:
        held = partial_path(cache, repo, blob.etag).stat().st_size
    except OSError:
        return 0
    return held if held <= blob.size else 0


def fetch(cache: Path, remote: RemoteRepo, blob: Blob, hashed: Callable[[Path], tuple[str, str]],
          moved: Callable[[int], None]) -> str:
    """Bring one blob into the cache from where an earlier run stopped, check it, then (only then) put it in
    place of whatever blob and links stood there; its sha256. moved(n) as bytes arrive (raising there, e.g.
    KeyboardInterrupt, stops the fetch and keeps what arrived); hashed(path) gives (sha256, git blob id)."""
    import httpx2
    f = blob.files[0]
    part = partial_path(cache, remote.repo, blob.etag)
    part.parent.mkdir(parents=True, exist_ok=True)
    overflowed = False
    for attempt in range(ATTEMPTS):
        moved(0)  # the caller's chance to stop us (it raises) before another request
        try:
            overflowed = _get(remote, f, part, moved)
            break
        except (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError):
            if attempt == ATTEMPTS - 1 or partial_bytes(cache, remote.repo, blob) == 0:
                raise  # nothing arrived: the hub is out of reach, which the caller explains
    have = part.stat().st_size
    if have != f.size:
        part.unlink(missing_ok=True)
        raise OSError(f"{f.path} arrived with {have} bytes where the hub announced {f.size}")
    sha256, blob_id = hashed(part)
    if not verifies(f, sha256, blob_id):
        part.unlink(missing_ok=True)
        raise BadBytes(f.path, overflowed)
    # checked: now it may replace a blob a served snapshot reads (a rename: readers see old or new, never none)
    os.replace(part, blob_path(cache, remote.repo, blob.etag))
    link(cache, remote, blob)
    return sha256


def _get(remote: RemoteRepo, f: RemoteFile, part: Path, moved: Callable[[int], None]) -> bool:
    """Append f's missing bytes to part, never past its announced size; True when the hub sent more."""
    import httpx2
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:  # not this file's beginning: start over
        part.unlink()
        have = 0
    if have == f.size:
        return False
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # byte offsets must be the file's, not a compressed stream's
    if have:
        headers["Range"] = f"bytes={have}-"
    url = hf_hub_url(remote.repo, f.path, revision=remote.commit)
    cut: Exception | None = None
    overflowed = False
    # the client follows the hub's redirect to its CDN and drops the token there (another origin)
    with http_stream_backoff("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
        hf_raise_for_status(r)
        # A server that ignores Range answers 200 with the whole file: then the part starts over.
        # Unbuffered, each block as it arrives: what a kill leaves on disk is all that arrived.
        with open(part, "ab" if r.status_code == 206 else "wb", buffering=0) as out:
            left = f.size - out.tell()
            try:
                for chunk in r.iter_bytes():
                    # what goes past the announced size is never written: a lying hub cannot fill the disk
                    view = memoryview(chunk)[:left]
                    kept, overflowed = len(view), len(chunk) > left
                    while view:
                        view = view[out.write(view):]
                    left -= kept
                    moved(kept)
                    if overflowed:
                        break
            except (httpx2.TimeoutException, httpx2.NetworkError) as exc:
                # raised here it would reach huggingface_hub's retry generator, which swallows it, yields
                # again and ends in "generator didn't stop after throw()": re-raised once out, fetch resumes
                cut = exc
    if cut is not None:
        raise cut
    return overflowed


def link(cache: Path, remote: RemoteRepo, blob: Blob, files: list[RemoteFile] | None = None) -> None:
    """snapshots/COMMIT/PATH -> ../../blobs/ETAG for the blob's paths (all, or files), relative as huggingface_hub
    makes it; a link already right is left untouched, anything else is replaced atomically (never removed first)."""
    target = blob_path(cache, remote.repo, blob.etag)
    for f in blob.files if files is None else files:
        pointer = pointer_path(cache, remote, f)
        pointer.parent.mkdir(parents=True, exist_ok=True)
        rel = os.path.relpath(target, pointer.parent)
        if pointer.is_symlink() and os.readlink(pointer) == rel:
            continue
        tmp = pointer.with_name(f".{pointer.name}.link")
        tmp.unlink(missing_ok=True)
        os.symlink(rel, tmp)
        os.replace(tmp, pointer)
