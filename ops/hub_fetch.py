"""Fetch a repo's files from the Hugging Face hub into huggingface_hub's cache layout, resuming byte-exactly.

huggingface_hub 2.4 writes each file to a process-unique temporary name and deletes it when the download
fails, so a download killed half-way starts every unfinished file over: hours for a 600 GB model. Here a
file grows in blobs/ETAG.incomplete, a rerun asks the hub only for the bytes it lacks (an HTTP Range), and
the finished blob is renamed and linked from snapshots/COMMIT/ as huggingface_hub links it, so every Hugging
Face tool (mlx-lm too) reads the result. huggingface_hub still does the talking: the endpoint (HF_ENDPOINT),
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
    blob_id: str | None = None  # git's sha1 of "blob SIZE\0" + the bytes, for every file


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


def blob_path(cache: Path, repo: str, f: RemoteFile) -> Path:
    return repo_folder(cache, repo) / "blobs" / f.etag


def partial_path(cache: Path, repo: str, f: RemoteFile) -> Path:
    return blob_path(cache, repo, f).with_name(f.etag + ".incomplete")


def pointer_path(cache: Path, remote: RemoteRepo, f: RemoteFile) -> Path:
    return snapshot_folder(cache, remote.repo, remote.commit) / f.path


def present(cache: Path, remote: RemoteRepo, f: RemoteFile) -> bool:
    """The snapshot holds the file with its size (its bytes are checked later, by the verify step)."""
    try:
        return pointer_path(cache, remote, f).stat().st_size == f.size
    except OSError:
        return False


def missing_bytes(cache: Path, remote: RemoteRepo, f: RemoteFile) -> int:
    """What a fetch of f still has to move: 0 when the snapshot has it or its blob is whole (another commit's)."""
    if present(cache, remote, f):
        return 0
    try:
        if blob_path(cache, remote.repo, f).stat().st_size == f.size:
            return 0
    except OSError:
        pass
    return f.size - partial_bytes(cache, remote.repo, f)


def partial_bytes(cache: Path, repo: str, f: RemoteFile) -> int:
    try:
        return min(partial_path(cache, repo, f).stat().st_size, f.size)
    except OSError:
        return 0


def forget(cache: Path, remote: RemoteRepo, f: RemoteFile) -> None:
    """Drop a file whose bytes are wrong, so the next fetch takes it whole."""
    for p in (pointer_path(cache, remote, f), blob_path(cache, remote.repo, f), partial_path(cache, remote.repo, f)):
        p.unlink(missing_ok=True)


def fetch(cache: Path, remote: RemoteRepo, f: RemoteFile, moved: Callable[[int], None]) -> None:
    """Bring one file into the cache, from where an earlier run stopped; moved(n) as bytes arrive (raising
    there, e.g. KeyboardInterrupt, stops the fetch and keeps what arrived)."""
    import httpx2
    blob, part = blob_path(cache, remote.repo, f), partial_path(cache, remote.repo, f)
    blob.parent.mkdir(parents=True, exist_ok=True)
    if not (blob.is_file() and blob.stat().st_size == f.size):
        for attempt in range(ATTEMPTS):
            moved(0)  # the caller's chance to stop us (it raises) before another request
            try:
                _get(remote, f, part, moved)
                break
            except (httpx2.TimeoutException, httpx2.NetworkError, httpx2.RemoteProtocolError):
                if attempt == ATTEMPTS - 1 or partial_bytes(cache, remote.repo, f) == 0:
                    raise  # nothing arrived: the hub is out of reach, which the caller explains
        have = part.stat().st_size
        if have != f.size:
            part.unlink(missing_ok=True)
            raise OSError(f"{f.path} arrived with {have} bytes where the hub announced {f.size}")
        os.replace(part, blob)
    _link(blob, pointer_path(cache, remote, f))


def _get(remote: RemoteRepo, f: RemoteFile, part: Path, moved: Callable[[int], None]) -> None:
    import httpx2
    from huggingface_hub import constants, hf_hub_url
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status, http_stream_backoff
    have = part.stat().st_size if part.exists() else 0
    if have > f.size:  # not this file's beginning: start over
        part.unlink()
        have = 0
    if have == f.size:
        return
    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # byte offsets must be the file's, not a compressed stream's
    if have:
        headers["Range"] = f"bytes={have}-"
    url = hf_hub_url(remote.repo, f.path, revision=remote.commit)
    cut: Exception | None = None
    with http_stream_backoff("GET", url, headers=headers, timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as r:
        hf_raise_for_status(r)
        # A server that ignores Range answers 200 with the whole file: then the part starts over.
        # Unbuffered, each block as it arrives: what a kill leaves on disk is all that arrived.
        with open(part, "ab" if r.status_code == 206 else "wb", buffering=0) as out:
            try:
                for chunk in r.iter_bytes():
                    view = memoryview(chunk)
                    while view:
                        view = view[out.write(view):]
                    moved(len(chunk))
            except (httpx2.TimeoutException, httpx2.NetworkError) as exc:
                # raised here it would reach huggingface_hub's retry generator, which swallows it, yields
                # again and ends in "generator didn't stop after throw()": re-raised once out, fetch resumes
                cut = exc
    if cut is not None:
        raise cut


def _link(blob: Path, pointer: Path) -> None:
    """snapshots/COMMIT/PATH -> ../../blobs/ETAG, relative as huggingface_hub makes it."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    target = os.path.relpath(blob, pointer.parent)
    if pointer.is_symlink() and os.readlink(pointer) == target:
        return
    pointer.unlink(missing_ok=True)
    os.symlink(target, pointer)
