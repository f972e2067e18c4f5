"""`launch.sh download REPO_OR_FOLDER [--revision R]`: fetch a model once on rank 0's host, check every file,
write the manifest that says it is whole, then hand it to the spreading to every other rank.

A repo id is fetched from the hub (HF_ENDPOINT, HF_TOKEN as huggingface_hub reads them) into rank 0's cache,
resuming what an earlier run left; files already there are not fetched again, but every file is hashed again
(a flipped byte on disk is found and fetched anew). A local folder is only hashed: nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlsplit

from config import Settings
from config.hub_cache import HASH_CHUNK, Manifest, ManifestFile, is_repo_id, write_manifest
from ops import cluster, hub_fetch
from ops.hub_fetch import Blob, RemoteRepo
from ops.layout import Die
from ops.pidfile import Busy, Lock
from ops.progress import Progress, human_bytes

WORKERS = 4  # files fetched at once: a hub CDN serves one stream slower than the link a Mac has


def download(settings: Settings, source: str, revision: str | None) -> int:
    """0 when rank 0's cache (and, through spread, every rank's) holds the model whole; Die(1) with why."""
    hosts = rank_hosts(settings)  # a hostfile fault is said before a long download, not after
    with one_at_a_time(settings):
        return _download(settings, source, revision, hosts)


@contextlib.contextmanager
def one_at_a_time(settings: Settings):
    """One download (and spread) per run folder: two appending to one partial file corrupt it, and the
    dashboard's single transfer.json would show both by turns."""
    lock = Lock(settings.run_dir / "download.lock")
    try:
        settings.run_dir.mkdir(parents=True, exist_ok=True)
        lock.acquire()
    except Busy as busy:
        who = f" (pid {busy.pid})" if busy.pid is not None else ""
        raise Die(1, f"another download{who} is running from {settings.run_dir}: wait for it to end (the dashboard "
                     "shows its progress), then run this one") from None
    except OSError as exc:
        raise Die(1, f"cannot create the lock {lock.path}: {exc}") from None
    try:
        yield
    finally:
        lock.release()


def _download(settings: Settings, source: str, revision: str | None, hosts: list[str]) -> int:
    folder = Path(source).expanduser()
    if folder.is_dir():
        if revision:
            raise Die(2, f"--revision applies to a hub repo id; {source} is a local folder")
        manifest = folder_manifest(settings, folder.resolve())
    elif is_repo_id(source):
        manifest = hub_download(settings, source, revision or "main")
    else:
        raise Die(2, f"{source!r} is neither a folder here nor a hub repo id (ORG/NAME)")
    from ops import spread
    return spread.spread(settings, manifest, hosts)


def rank_hosts(settings: Settings) -> list[str]:
    """One host name per rank, rank 0 first."""
    hosts, faults = cluster.cluster_hosts(settings)
    if faults:
        raise Die(1, "; ".join(faults))
    names = [""] * sum(len(h.ranks) for h in hosts)
    for h in hosts:
        for rank in h.ranks:
            names[rank] = h.name
    return names


def folder_manifest(settings: Settings, folder: Path) -> Manifest:
    """A local folder as a manifest (repo: its absolute path, no revision): hashed, not copied."""
    paths = model_files(folder)
    progress = Progress(settings.run_dir, str(folder), "verify", sum(p.stat().st_size for p in paths))
    files = []
    for p in paths:
        sha256, _ = hash_file(p, lambda n, name=p.name: progress.add(n, name))
        files.append(ManifestFile(p.relative_to(folder).as_posix(), p.stat().st_size, sha256))
    progress.done(f"verify {folder}: {len(files)} files, {human_bytes(progress.state.bytes_done)} hashed")
    return Manifest(repo=str(folder), revision="", commit="", files=tuple(files))


def model_files(folder: Path) -> list[Path]:
    """The folder's files, hidden entries left out (.git, huggingface_hub's .cache/ of a local_dir download).
    A link is followed only to a file inside the folder, or inside the repo folder of a Hugging Face snapshot
    (its blobs/): any other target would be copied to every rank, so it is refused."""
    inside = [folder] + ([folder.parent.parent] if folder.parent.name == "snapshots" else [])
    out = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in [*dirs, *sorted(names)]:
            path = Path(root) / name
            if name.startswith(".") or not (path.is_symlink() or path.is_file()):
                continue
            target = path.resolve()
            if path.is_symlink() and (path.is_dir() or not target.is_file()
                                      or not any(target.is_relative_to(top) for top in inside)):
                raise Die(1, f"{path} is a link to {target}, outside the model folder {folder}: links are not "
                             "followed out of it (their targets would be copied to every rank); copy that file "
                             "into the folder instead, then run the download again")
            if name in names:
                out.append(path)
    return sorted(out)


def hub_download(settings: Settings, repo: str, revision: str) -> Manifest:
    """The repo's files in rank 0's cache, each checked against the hub's hashes, then the manifest (last)."""
    cache = settings.hub_cache(0)
    remote = _listed(repo, revision)
    sums, todo = _check_present(settings, cache, remote)
    check_space(cache, repo, sum(b.size - hub_fetch.partial_bytes(cache, repo, b) for b in todo))
    bad = _fetch(settings, cache, remote, todo, sums)
    if bad:  # wrong bytes arrived (a flipped bit on the way, a partial from a broken run): once more, whole
        bad = _fetch(settings, cache, remote, bad, sums, again=True)
    if bad:
        names = ", ".join(b.files[0].path for b in bad)
        more = (" (it sent more bytes than it announced; nothing past the announced size was kept)"
                if any(bad.values()) else "")
        raise Die(1, f"{names} of {repo} from {hub_fetch.endpoint()} still differ from the hub's hashes after a "
                     f"second fetch{more}: a broken mirror (check HF_ENDPOINT), or the disk under {cache} corrupts "
                     "data; check it, then run the download again")
    files = tuple(ManifestFile(f.path, f.size, sums[f.etag]) for f in remote.files)
    manifest = Manifest(repo=repo, revision=revision, commit=remote.commit, files=files)
    write_manifest(cache, manifest)
    print(f"{repo} ({remote.commit[:12]}) is whole in {cache}: {len(files)} files, "
          f"{human_bytes(remote.total_bytes)}", file=sys.stderr, flush=True)
    return manifest


def _listed(repo: str, revision: str) -> RemoteRepo:
    try:
        return hub_fetch.list_repo(repo, revision)
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one sentence, never a traceback
        raise Die(1, explain(exc, repo, revision)) from None


def check_space(cache: Path, repo: str, needed: int) -> None:
    """Before any byte moves: what will be written (never more than the hub announced) must fit on the disk."""
    disk = cache
    while not disk.exists() and disk != disk.parent:
        disk = disk.parent
    free = shutil.disk_usage(disk).free
    if needed > free:
        raise Die(1, f"{socket.gethostname()} has too little space for {repo}: {human_bytes(needed)} "
                     f"({needed} bytes) needed in {cache}, {human_bytes(free)} ({free} bytes) free; free some "
                     "space there or set HUB_CACHE to a larger disk")


def _check_present(settings: Settings, cache: Path, remote: RemoteRepo) -> tuple[dict[str, str], list[Blob]]:
    """({etag: sha256} of the blobs already here and right, the blobs to fetch). What is right is left as it
    is (a re-run touches nothing); a missing link to a right blob is made; nothing is deleted."""
    progress: Progress | None = None  # shown once there is something here to check
    hashes: dict[str, tuple[str, str]] = {}  # real path -> (sha256, blob id): each file read once

    def hashed(path: Path, size: int) -> tuple[str, str] | None:
        try:
            real = os.path.realpath(path)
            if os.stat(real).st_size != size:
                return None
        except OSError:
            return None
        nonlocal progress
        if progress is None:
            progress = Progress(settings.run_dir, remote.repo, "verify", remote.total_bytes)
        if real not in hashes:
            hashes[real] = hash_file(Path(real), lambda n: progress.add(n, path.name))
        return hashes[real]

    sums, todo = {}, []
    for blob in hub_fetch.blobs(remote):
        f = blob.files[0]
        found = {g.path: hashed(hub_fetch.pointer_path(cache, remote, g), blob.size) for g in blob.files}
        wrong = [g for g in blob.files if found[g.path] is None or not hub_fetch.verifies(g, *found[g.path])]
        good = next((h for h in found.values() if h is not None and hub_fetch.verifies(f, *h)), None)
        if wrong:
            stored = hashed(hub_fetch.blob_path(cache, remote.repo, blob.etag), blob.size)
            if stored is None or not hub_fetch.verifies(f, *stored):
                todo.append(blob)
                continue
            hub_fetch.link(cache, remote, blob, wrong)
            good = stored
        sums[blob.etag] = good[0]
    lacking = [f.path for b in todo for f in b.files]
    if progress is not None:
        progress.done(f"verify {remote.repo}: {len(remote.files) - len(lacking)} of {len(remote.files)} files here "
                      "match the hub's hashes" + (f"; to fetch: {', '.join(lacking[:5])}" if lacking else "")
                      + (", ..." if len(lacking) > 5 else ""))
    return sums, todo


def _fetch(settings: Settings, cache: Path, remote: RemoteRepo, todo: list[Blob], sums: dict[str, str],
           again: bool = False) -> dict[Blob, bool]:
    """Fetch each blob once (workers at once), checked before it replaces anything; {blob: it overflowed} of
    those whose bytes did not match the hub's hashes (their partial dropped, so a next fetch starts whole)."""
    if not todo:
        return {}
    total = sum(b.size - hub_fetch.partial_bytes(cache, remote.repo, b) for b in todo)
    progress = Progress(settings.run_dir, remote.repo, "download", total, hosts=[hub_fetch.endpoint()])
    lock = threading.Lock()
    stop = threading.Event()  # Ctrl-C: the workers end at their next block instead of finishing their files
    bad: dict[Blob, bool] = {}

    def one(blob: Blob) -> None:
        def moved(n: int) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            with lock:
                progress.add(n, blob.files[0].path)
        try:
            sha256 = hub_fetch.fetch(cache, remote, blob, lambda p: hash_file(p, lambda n: None), moved)
        except hub_fetch.BadBytes as exc:
            with lock:
                bad[blob] = exc.overflowed
            return
        except Exception as exc:  # noqa: BLE001 - named with its file for the one sentence below
            raise FileFailed(blob.files[0].path, exc) from exc
        with lock:
            sums[blob.etag] = sha256

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            try:
                for future in [pool.submit(one, b) for b in todo]:
                    future.result()
            except BaseException:
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    except KeyboardInterrupt:
        progress.failed("interrupted (what arrived is kept: the next run resumes it)")
        raise
    except FileFailed as failed:
        sentence = explain(failed.cause, remote.repo, remote.revision, failed.path)
        progress.failed(sentence)
        raise Die(1, sentence + " (what arrived is kept: the next run resumes it)") from None
    word = "fetched again" if again else "fetched"
    note = f"; {len(bad)} differ from the hub's hashes" if bad else ""
    (progress.failed if bad else progress.done)(
        f"download {remote.repo}: {len(todo) - len(bad)} of {len(hub_fetch.blobs(remote))} files {word} and "
        f"checked against the hub's hashes, {human_bytes(progress.state.bytes_done)} moved{note}")
    return bad


class FileFailed(Exception):
    """A fetch that failed for a reason the hub or the disk gave, with the file it was fetching."""

    def __init__(self, path: str, cause: Exception):
        super().__init__(path)
        self.path, self.cause = path, cause


def hash_file(path: Path, read: Callable[[int], None]) -> tuple[str, str]:
    """sha256 and git's blob id (sha1 of "blob SIZE\\0" + bytes) in one pass; read(n) after each block."""
    sha256 = hashlib.sha256()
    sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    with open(path, "rb") as f:
        while block := f.read(HASH_CHUNK):
            sha256.update(block)
            sha1.update(block)
            read(len(block))
    return sha256.hexdigest(), sha1.hexdigest()


def explain(exc: BaseException, repo: str, revision: str, path: str = "") -> str:
    """One sentence with what to do, for every way the hub (or the CDN it redirects to) can say no."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    where = hub_fetch.endpoint()
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    what = f"{path} of {repo}" if path else repo
    if isinstance(exc, hub_fetch.HubAnswerRefused):
        return (f"{where} listed {repo} with {exc}: refused, nothing fetched (a broken or hostile hub or mirror: "
                "check HF_ENDPOINT)")
    if isinstance(exc, GatedRepoError):
        return (f"{repo} on {where} is gated: accept its terms on the hub's page, then set HF_TOKEN to a token of "
                "that account")
    if isinstance(exc, RevisionNotFoundError):
        return f"{repo} has no revision {revision!r} on {where}: name a branch, a tag or a commit it has"
    if isinstance(exc, RepositoryNotFoundError):
        return (f"{repo} was not found on {where} (or it is private): check the name, or set HF_TOKEN to a "
                "token that can read it")
    # a file's bytes may come from another host (the hub redirects LFS files to its CDN): name who answered
    host = _origin(response) or where
    if isinstance(exc, RemoteEntryNotFoundError) or (path and status == 404):
        return f"{host} answered HTTP 404 for {what}, which {where} lists: run the download again later"
    if isinstance(exc, HfHubHTTPError) and status in (401, 403) and host == where:
        return (f"{where} refused the token for {repo} (HTTP {status}): set HF_TOKEN to a valid token that can "
                "read it")
    if isinstance(exc, HfHubHTTPError):
        return f"{host} answered HTTP {status} for {what}: try again later ({_first_line(exc)})"
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
        return (f"no connection to {where} ({type(exc).__name__}): check the network, or set HF_ENDPOINT to a "
                "reachable hub or mirror")
    if isinstance(exc, OSError):
        return f"could not write {what} into the cache: {exc}"
    return f"downloading {what} from {where} failed: {type(exc).__name__}: {_first_line(exc)}"


def _origin(response) -> str:
    """scheme://host:port of the server that gave this response ('' when there is none)."""
    try:
        url = urlsplit(str(response.url))
    except (AttributeError, RuntimeError, ValueError):
        return ""
    return f"{url.scheme}://{url.netloc}" if url.netloc else ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
