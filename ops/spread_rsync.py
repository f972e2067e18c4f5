"""SPREAD_TRANSPORT=rsync: spreading without the cluster's transport, from rank 0's host over ssh.

Every target is surveyed first (what it lacks, its free bytes) and a host without room is refused before
any byte moves. A remote host gets rank 0's files of this commit with `rsync --partial` (the snapshot's
links and the blobs they point at, so the layout is rank 0's), then hashes them itself (`python -m
config.hub_store` in the project's folder there, which `./launch.sh sync` put in place): a damaged file
is removed and copied again once, and the manifest is written there last. A target on this host (a
second rank with a cache of its own) is copied here by Python, resumable and checked as it is written.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

from config import REPO_ROOT, Settings
from config.hub_cache import Manifest, repo_folder, snapshot_folder, write_manifest
from config.hub_store import COMPLETE, Incoming, RankStore, items
from ipc.spread import test_hook
from ops.remote import rsync, ssh
from ops.progress import Progress, human_bytes

LOCAL = {"127.0.0.1", "localhost", "::1"}
COPY_CHUNK = 8 << 20
REMOTE_TIMEOUT = 3600.0  # seconds for one remote survey or verify: it hashes the whole model


def rsync_spread(settings: Settings, manifest: Manifest, hosts: list[str], ranks: list[int]) -> int:
    """0 when every target rank holds the model whole; else 1 after one sentence."""
    local = {r for r in ranks if hosts[r] in LOCAL or hosts[r] == hosts[0]}
    needs: dict[int, int] = {}
    for r in ranks:
        try:
            facts = _local_survey(settings.hub_cache(r), manifest) if r in local else \
                _remote(hosts[r], "survey", settings.hub_cache(r), manifest)
        except SpreadError as exc:
            return _fail(str(exc))
        if (free := test_hook("MCS_SPREAD_TEST_FREE_BYTES", r)) is not None:
            facts["free"] = free
        if facts["need"] > facts["free"]:
            return _fail(f"host {hosts[r]} (rank {r}) needs {human_bytes(facts['need'])} ({facts['need']} bytes) in "
                         f"{settings.hub_cache(r)} for {manifest.repo} but has {human_bytes(facts['free'])} "
                         f"({facts['free']} bytes) free: nothing was copied; free some space there or point its "
                         "cache (HUB_CACHE, HUB_CACHE_PER_RANK) at a larger disk")
        needs[r] = facts["need"]
    progress = Progress(settings.run_dir, manifest.repo, "spread", sum(needs.values()), [hosts[r] for r in ranks])
    try:
        for r in ranks:
            if r in local:
                _copy_here(settings.hub_cache(0), settings.hub_cache(r), manifest, progress)
            else:
                _rsync_to(hosts[r], settings.hub_cache(0), settings.hub_cache(r), manifest, needs[r], progress)
    except SpreadError as exc:
        progress.failed(str(exc))
        return _fail(str(exc))
    progress.done()
    print(f"spread: bytes_sent={progress.state.bytes_done}")
    return 0


class SpreadError(Exception):
    """One sentence saying why a target could not be brought up to date."""


def _fail(message: str) -> int:
    print(f"spread: {message}", file=sys.stderr, flush=True)
    return 1


def _local_survey(cache: Path, manifest: Manifest) -> dict:
    from config.hub_store import survey

    return survey(cache, manifest)


def _copy_here(src_cache: Path, cache: Path, manifest: Manifest, progress: Progress) -> None:
    """The blobs this cache lacks, from rank 0's cache on this host, resumed from a partial, each checked."""
    src = snapshot_folder(src_cache, manifest.repo, manifest.commit)
    store = RankStore(cache, manifest)
    for item in items(manifest):
        held = store.have(item)
        if held == COMPLETE:
            continue
        incoming = Incoming(store, item, held)
        with open(src / item.paths[0], "rb") as f:
            f.seek(incoming.held)
            while block := f.read(COPY_CHUNK):
                incoming.write(incoming.held, memoryview(block))
                progress.add(len(block), item.paths[0])
        if not incoming.close():
            raise SpreadError(f"{item.paths[0]} copied to {cache} has another sha256 than the manifest's: rank 0's "
                              "copy is damaged; download the model again")
    write_manifest(cache, manifest)


def _remote(host: str, verb: str, cache: Path, manifest: Manifest) -> dict:
    """`python -m config.hub_store VERB CACHE` on host, the manifest on its stdin."""
    root = shlex.quote(str(REPO_ROOT))
    remote = (f"cd {root} && p=.venv/bin/python; [ -x \"$p\" ] || p=python3; "
              f"exec \"$p\" -m config.hub_store {verb} {shlex.quote(str(cache))}")
    try:
        r = subprocess.run(ssh(host, remote), input=manifest.to_json().encode(),
                           capture_output=True, timeout=REMOTE_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise SpreadError(f"host {host} did not finish checking its cache within {REMOTE_TIMEOUT:.0f} s") from None
    if r.returncode != 0:
        last = (r.stderr.decode(errors="replace").strip().splitlines() or ["(no output)"])[-1]
        raise SpreadError(f"ssh {host} could not check its cache (exit {r.returncode}: {last}); is the project "
                          f"at {REPO_ROOT} there (./launch.sh sync)?")
    return json.loads(r.stdout)


def rsync_files(src_cache: Path, manifest: Manifest) -> list[str]:
    """The paths rsync copies, relative to the repo folder: the snapshot's entries and the blobs they link to."""
    folder = repo_folder(src_cache, manifest.repo)
    snap = snapshot_folder(src_cache, manifest.repo, manifest.commit)
    out = []
    for f in manifest.files:
        path = snap / f.path
        out.append(str(path.relative_to(folder)))
        real = path.resolve()
        if path.is_symlink() and real.is_relative_to(folder):
            out.append(str(real.relative_to(folder)))
    return out


def rsync_command(host: str, src_cache: Path, cache: Path, manifest: Manifest) -> list[str]:
    src = repo_folder(src_cache, manifest.repo)
    dest = repo_folder(cache, manifest.repo)
    return rsync(["-a", "--partial", "--files-from=-"], f"{src}/", host, f"{dest}/")


def _rsync_to(host: str, src_cache: Path, cache: Path, manifest: Manifest, need: int, progress: Progress) -> None:
    files = "\n".join(rsync_files(src_cache, manifest)).encode()
    dest = shlex.quote(str(repo_folder(cache, manifest.repo)))
    # macOS's own rsync (2.6.9, or openrsync) has no --mkpath
    if subprocess.run(ssh(host, f"mkdir -p {dest}")).returncode != 0:
        raise SpreadError(f"ssh {host} could not create {dest}")
    for attempt in (1, 2):
        r = subprocess.run(rsync_command(host, src_cache, cache, manifest), input=files)
        if r.returncode != 0:
            raise SpreadError(f"rsync to {host} failed (exit {r.returncode}); run the spread again to resume")
        verdict = _remote(host, "commit", cache, manifest)
        if not verdict["bad"]:
            progress.add(need, host)
            return
        if attempt == 2:
            raise SpreadError(f"{verdict['bad'][0]} on host {host} still differs from the manifest's sha256 after "
                              "a second copy: rank 0's copy may be damaged; download the model again")
