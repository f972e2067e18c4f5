"""`launch.sh download REPO_OR_FOLDER [--revision R]`: fetch a model once on rank 0's host, check every file,
write the manifest that says it is whole, then hand it to the spreading to every other rank.

A repo id is fetched from the hub (HF_ENDPOINT, HF_TOKEN as huggingface_hub reads them) into rank 0's cache,
resuming what an earlier run left; files already there are not fetched again, but every file is hashed again
(a flipped byte on disk is found and fetched anew). A local folder is only hashed: nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from config import Settings
from config.hub_cache import HASH_CHUNK, Manifest, ManifestFile, is_repo_id, write_manifest
from ops import cluster, hub_fetch
from ops.hub_fetch import RemoteFile, RemoteRepo
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
    # hidden entries (.git, huggingface_hub's .cache/ of a local_dir download) are not the model's
    paths = sorted(p for p in folder.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))
    progress = Progress(settings.run_dir, str(folder), "verify", sum(p.stat().st_size for p in paths))
    files = []
    for p in paths:
        sha256, _ = hash_file(p, lambda n, name=p.name: progress.add(n, name))
        files.append(ManifestFile(p.relative_to(folder).as_posix(), p.stat().st_size, sha256))
    progress.done(f"verify {folder}: {len(files)} files, {human_bytes(progress.state.bytes_done)} hashed")
    return Manifest(repo=str(folder), revision="", commit="", files=tuple(files))


def hub_download(settings: Settings, repo: str, revision: str) -> Manifest:
    cache = settings.hub_cache(0)
    remote = _listed(repo, revision)
    check_space(cache, remote)
    _fetch_missing(settings, cache, remote)
    files, bad = _verify(settings, cache, remote)
    if bad:  # wrong bytes on disk (a flipped bit, a truncated copy): fetched once more, then checked again
        for f in bad:
            hub_fetch.forget(cache, remote, f)
        _fetch_missing(settings, cache, remote)
        files, bad = _verify(settings, cache, remote)
        if bad:
            raise Die(1, f"{', '.join(f.path for f in bad)} of {repo} still differ from the hub's hashes after "
                         "a second fetch: the disk under "
                         f"{cache} or the connection corrupts data; check it, then run the download again")
    manifest = Manifest(repo=repo, revision=revision, commit=remote.commit, files=tuple(files))
    write_manifest(cache, manifest)
    print(f"{repo} ({remote.commit[:12]}) is whole in {cache}: {len(files)} files, "
          f"{human_bytes(remote.total_bytes)}", file=sys.stderr, flush=True)
    return manifest


def _listed(repo: str, revision: str) -> RemoteRepo:
    try:
        return hub_fetch.list_repo(repo, revision)
    except Exception as exc:  # noqa: BLE001 - every hub failure becomes one sentence, never a traceback
        raise Die(1, explain(exc, repo, revision)) from None


def check_space(cache: Path, remote: RemoteRepo) -> None:
    """Before any byte moves: the bytes still missing must fit on the cache's disk."""
    needed = sum(hub_fetch.missing_bytes(cache, remote, f) for f in remote.files)
    disk = cache
    while not disk.exists() and disk != disk.parent:
        disk = disk.parent
    free = shutil.disk_usage(disk).free
    if needed > free:
        raise Die(1, f"{socket.gethostname()} has too little space for {remote.repo}: {human_bytes(needed)} "
                     f"({needed} bytes) needed in {cache}, {human_bytes(free)} ({free} bytes) free; free some "
                     "space there or set HUB_CACHE to a larger disk")


def _fetch_missing(settings: Settings, cache: Path, remote: RemoteRepo) -> None:
    todo = [f for f in remote.files if not hub_fetch.present(cache, remote, f)]
    total = sum(hub_fetch.missing_bytes(cache, remote, f) for f in todo)
    progress = Progress(settings.run_dir, remote.repo, "download", total, hosts=[hub_fetch.endpoint()])
    lock = threading.Lock()
    stop = threading.Event()  # Ctrl-C: the workers end at their next block instead of finishing their files

    def one(f: RemoteFile) -> None:
        def moved(n: int) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            with lock:
                progress.add(n, f.path)
        hub_fetch.fetch(cache, remote, f, moved)

    try:
        with ThreadPoolExecutor(WORKERS) as pool:
            try:
                for future in [pool.submit(one, f) for f in todo]:
                    future.result()
            except BaseException:
                stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
    except KeyboardInterrupt:
        progress.failed("interrupted (what arrived is kept: the next run resumes it)")
        raise
    except Exception as exc:  # noqa: BLE001 - the sentence says what to do; the parts stay for the next run
        sentence = explain(exc, remote.repo, remote.revision)
        progress.failed(sentence)
        raise Die(1, sentence + " (what arrived is kept: the next run resumes it)") from None
    progress.done(f"download {remote.repo}: {len(todo)} of {len(remote.files)} files fetched, "
                  f"{human_bytes(progress.state.bytes_done)} moved")


def _verify(settings: Settings, cache: Path, remote: RemoteRepo) -> tuple[list[ManifestFile], list[RemoteFile]]:
    """Every file hashed; those that differ from the hub's sha256 (LFS) or git blob id are returned as bad."""
    progress = Progress(settings.run_dir, remote.repo, "verify", remote.total_bytes)
    files, bad = [], []
    for f in remote.files:
        path = hub_fetch.pointer_path(cache, remote, f)
        sha256, blob_id = hash_file(path, lambda n, name=f.path: progress.add(n, name))
        if (f.sha256 and sha256 != f.sha256) or (f.blob_id and blob_id != f.blob_id) or path.stat().st_size != f.size:
            bad.append(f)
        files.append(ManifestFile(f.path, f.size, sha256))
    if bad:
        progress.failed(f"{len(bad)} file(s) differ from the hub's hashes: {', '.join(f.path for f in bad)}; "
                        "fetching them again")
    else:
        progress.done(f"verify {remote.repo}: {len(files)} files match the hub's hashes")
    return files, bad


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


def explain(exc: BaseException, repo: str, revision: str) -> str:
    """One sentence with what to do, for every way the hub can say no."""
    import httpx2
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RemoteEntryNotFoundError,
                                        RepositoryNotFoundError, RevisionNotFoundError)
    where = hub_fetch.endpoint()
    status = getattr(getattr(exc, "response", None), "status_code", None)
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
    if isinstance(exc, RemoteEntryNotFoundError):
        return f"a file of {repo} listed by {where} is missing there: run the download again later"
    if isinstance(exc, HfHubHTTPError) and status in (401, 403):
        return (f"{where} refused the token for {repo} (HTTP {status}): set HF_TOKEN to a valid token that can "
                "read it")
    if isinstance(exc, HfHubHTTPError):
        return f"{where} answered HTTP {status} for {repo}: try again later ({_first_line(exc)})"
    if isinstance(exc, (httpx2.ConnectError, httpx2.TimeoutException, httpx2.NetworkError)):
        return (f"no connection to {where} ({type(exc).__name__}): check the network, or set HF_ENDPOINT to a "
                "reachable hub or mirror")
    if isinstance(exc, OSError):
        return f"could not write {repo} into the cache: {exc}"
    return f"downloading {repo} from {where} failed: {type(exc).__name__}: {_first_line(exc)}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
