"""`./launch.sh download` against a loopback stand-in for the Hugging Face hub (tests/hubstub.py): the real
command in a subprocess, a zoo model as the repo, the stub's own counts as the measure of what moved."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from config.hub_cache import find_snapshot, read_manifest, repo_folder, scan
from engine.zoo import ensure_zoo_model
from ops.procs import free_port, poll
from tests.harness import REPO
from tests.hub_model import flip_a_byte, hub_shaped
from tests.hubstub import HubStub

TIMEOUT = 120
TOKEN = "hf_stubtoken"


@pytest.fixture(scope="session")
def zoo_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_zoo_model("qwen3", tmp_path_factory.mktemp("zoo"))


@pytest.fixture(scope="session")
def shaped(zoo_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The zoo model as a hub repo holds one: 3 LFS shards, an index, .gitattributes, README.md, a duplicate."""
    return hub_shaped(zoo_folder, tmp_path_factory.mktemp("shaped") / "repo", copies=("original/tokenizer.json",))


@pytest.fixture
def hub(zoo_folder: Path, shaped: Path):
    with HubStub() as stub:
        stub.add("org/tiny", zoo_folder, tags=("v1.0",))
        stub.add("org/shaped", shaped)  # tokenizer.json (and its copy) regular files
        stub.add("org/shaped-lfs", shaped, lfs=("tokenizer.json", "original/tokenizer.json"))
        stub.add("org/gated", zoo_folder, token=TOKEN)
        # announces a weight file of 1 PB: more than any disk here has free
        stub.add("org/huge", zoo_folder, api_sizes={"model.safetensors": 10**15})
        yield stub


def _env(tmp: Path, endpoint: str, **more: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env |= {"HF_ENDPOINT": endpoint, "HUB_CACHE": str(tmp / "hub"), "RUN_DIR": str(tmp / "run"),
            "LOG_DIR": str(tmp / "logs"), "HF_HOME": str(tmp / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HOSTS": "127.0.0.1", "HUB_CACHE_PER_RANK": ""}
    return env | more


def download(tmp: Path, endpoint: str, *args: str, fsize: int | None = None, **env: str) -> subprocess.CompletedProcess:
    """The command in a subprocess; fsize caps the bytes any one file may grow to (a small disk, without one)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))) if fsize else None
    return subprocess.run([str(REPO / "launch.sh"), "download", *args], cwd=REPO, env=_env(tmp, endpoint, **env),
                          capture_output=True, text=True, timeout=TIMEOUT, preexec_fn=limit)


def hf_snapshot(tmp: Path, endpoint: str, cache: Path, repo: str, revision: str, **env: str) -> None:
    """huggingface_hub's own snapshot_download (the code mlx-lm uses) into cache."""
    code = ("import sys; from huggingface_hub import snapshot_download; "
            "snapshot_download(sys.argv[2], revision=sys.argv[3], cache_dir=sys.argv[1])")
    r = subprocess.run([sys.executable, "-c", code, str(cache), repo, revision], env=_env(tmp, endpoint, **env),
                       capture_output=True, text=True, timeout=TIMEOUT)
    assert r.returncode == 0, r.stderr


def _layout(cache: Path, repo: str) -> dict[str, str]:
    """What huggingface_hub's cache layout holds of a repo: refs, blobs by content, snapshot links by target."""
    folder = repo_folder(cache, repo)
    out = {}
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if rel.split("/")[0] in ("refs", "blobs", "snapshots") and (p.is_symlink() or p.is_file()):
            out[rel] = "-> " + os.readlink(p) if p.is_symlink() else _sha(p)
    return out


def _stats(cache: Path, repo: str) -> dict[str, tuple[int, int, int]]:
    """(inode, mtime, size) of every entry of a repo's folder, links not followed: what "touched" would change."""
    folder = repo_folder(cache, repo)
    return {p.relative_to(folder).as_posix(): (st.st_ino, st.st_mtime_ns, st.st_size)
            for p in sorted(folder.rglob("*")) if not p.is_dir() or p.is_symlink() for st in [p.lstat()]}


def _unique_bytes(hub: HubStub, repo: str) -> int:
    return sum({f.sha256: f.size for f in hub.repos[repo].files.values()}.values())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _assert_whole(cache: Path, repo: str, source: Path, revision: str = "main") -> Path:
    snap = find_snapshot(cache, repo, revision)
    assert snap is not None
    sources = {p.relative_to(source).as_posix(): _sha(p) for p in source.rglob("*") if p.is_file()}
    assert {p.relative_to(snap).as_posix(): _sha(p) for p in snap.rglob("*") if p.is_file()} == sources
    manifest = read_manifest(cache, repo, revision)
    assert manifest is not None and {f.path: f.sha256 for f in manifest.files} == sources
    return snap


def _one_sentence(r: subprocess.CompletedProcess) -> str:
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_download_from_an_empty_cache_then_a_second_run_moves_nothing(hub, zoo_folder, tmp_path) -> None:
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    assert "download org/tiny" in r.stderr and "checked against the hub's hashes" in r.stderr
    model_bytes = sum(p.stat().st_size for p in zoo_folder.iterdir())
    assert hub.served.total == model_bytes
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder)
    state = json.loads((tmp_path / "run" / "transfer.json").read_text())
    assert state["phase"] == "done" and state["model"] == "org/tiny"

    hub.reset()
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    assert hub.served.total == 0
    assert not [q for q in hub.served.requests if "/resolve/" in q["path"]]


def test_a_download_killed_half_way_resumes_from_where_it_stopped(hub, zoo_folder, tmp_path) -> None:
    weights = (zoo_folder / "model.safetensors").stat().st_size
    model_bytes = sum(p.stat().st_size for p in zoo_folder.iterdir())
    hub.hold(weights // 2)
    proc = subprocess.Popen([str(REPO / "launch.sh"), "download", "org/tiny"], cwd=REPO,
                            env=_env(tmp_path, hub.url), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    blobs = repo_folder(tmp_path / "hub", "org/tiny") / "blobs"

    def half_on_disk() -> bool:
        """The small files whole, the weights' part at the stub's hold: nothing more will move."""
        sizes, whole = [], 0
        for p in blobs.iterdir() if blobs.is_dir() else ():
            try:
                if p.name.endswith(".incomplete"):
                    sizes.append(p.stat().st_size)
                else:
                    whole += 1
            except OSError:  # a small file's part renamed meanwhile
                return False
        return sizes == [weights // 2] and whole == len(list(zoo_folder.iterdir())) - 1

    try:
        hub.wait_served(weights // 2, path="model.safetensors", timeout=TIMEOUT)
        assert poll(half_on_disk, TIMEOUT)  # the stub holds there: the downloader writes that much, then waits
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    hub.release()
    first = hub.served.total
    parts = list(blobs.glob("*.incomplete"))
    assert len(parts) == 1 and parts[0].stat().st_size == weights // 2
    assert read_manifest(tmp_path / "hub", "org/tiny") is None

    hub.reset()
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.served.requests if q["file"] == "model.safetensors" and q["method"] == "GET" and q["status"] != 302]
    assert [q["range"] for q in gets] == [f"bytes={weights // 2}-"]
    assert hub.served.bytes == {"model.safetensors": weights - weights // 2}
    assert first + hub.served.total < 1.2 * model_bytes
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder)


def test_a_corrupted_file_is_found_and_fetched_again(hub, zoo_folder, tmp_path) -> None:
    assert download(tmp_path, hub.url, "org/tiny").returncode == 0
    weights = find_snapshot(tmp_path / "hub", "org/tiny") / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 3] ^= 0x01  # same size, one bit flipped: only hashing finds it
    weights.resolve().write_bytes(bytes(data))

    hub.reset()
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    assert "model.safetensors" in r.stderr
    assert hub.served.bytes == {"model.safetensors": len(data)}
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder)


def test_revision_as_a_tag_or_a_commit(hub, zoo_folder, tmp_path) -> None:
    r = download(tmp_path, hub.url, "org/tiny", "--revision", "v1.0")
    assert r.returncode == 0, r.stderr
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder, "v1.0")
    commit = hub.repos["org/tiny"].commit
    hub.reset()
    r = download(tmp_path, hub.url, "org/tiny", "--revision", commit)
    assert r.returncode == 0, r.stderr
    assert hub.served.total == 0
    assert read_manifest(tmp_path / "hub", "org/tiny", commit).commit == commit


def test_a_gated_repo_needs_hf_token_and_gets_it_sent(hub, zoo_folder, tmp_path) -> None:
    assert "HF_TOKEN" in _one_sentence(download(tmp_path, hub.url, "org/gated"))
    assert "HF_TOKEN" in _one_sentence(download(tmp_path, hub.url, "org/gated", HF_TOKEN="hf_wrong"))
    hub.reset()
    r = download(tmp_path, hub.url, "org/gated", HF_TOKEN=TOKEN)
    assert r.returncode == 0, r.stderr
    assert {q["authorization"] for q in hub.requests_on("hub")} == {f"Bearer {TOKEN}"}
    # the weights come from the CDN the hub redirects to: another host, which never sees the token
    assert hub.requests_on("cdn") and {q["authorization"] for q in hub.requests_on("cdn")} == {None}
    _assert_whole(tmp_path / "hub", "org/gated", zoo_folder)


def test_hub_refusals_are_one_sentence_each(hub, tmp_path) -> None:
    assert "org/nothere was not found" in _one_sentence(download(tmp_path, hub.url, "org/nothere"))
    assert "no revision 'v9'" in _one_sentence(download(tmp_path, hub.url, "org/tiny", "--revision", "v9"))
    nobody = f"http://127.0.0.1:{free_port()}"
    assert f"no connection to {nobody}" in _one_sentence(download(tmp_path, nobody, "org/tiny"))
    assert hub.served.total == 0


def test_too_little_space_is_said_before_any_byte_moves(hub, tmp_path) -> None:
    sentence = _one_sentence(download(tmp_path, hub.url, "org/huge"))
    assert os.uname().nodename in sentence and "needed" in sentence and "free" in sentence
    assert "1000.0 TB" in sentence
    assert hub.served.total == 0


def test_a_local_folder_is_hashed_not_downloaded(zoo_folder, tmp_path) -> None:
    r = download(tmp_path, "http://127.0.0.1:9", str(zoo_folder))
    assert r.returncode == 0, r.stderr
    assert f"verify {zoo_folder}" in r.stderr
    assert not (tmp_path / "hub").exists()


def test_bad_arguments_exit_2(tmp_path) -> None:
    assert download(tmp_path, "http://127.0.0.1:9").returncode == 2
    r = download(tmp_path, "http://127.0.0.1:9", "not a repo")
    assert r.returncode == 2 and "neither a folder here nor a hub repo id" in r.stderr


def test_a_new_commit_moves_only_the_files_that_changed(hub, zoo_folder, tmp_path) -> None:
    assert download(tmp_path, hub.url, "org/tiny").returncode == 0
    newer = tmp_path / "newer"
    shutil.copytree(zoo_folder, newer)
    config = json.loads((newer / "config.json").read_text())
    (newer / "config.json").write_text(json.dumps(config | {"note": "a later commit"}))
    old_commit = hub.repos["org/tiny"].commit
    hub.add("org/tiny", newer)  # main now names a new commit that shares every other file
    hub.reset()
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    assert hub.served.bytes == {"config.json": (newer / "config.json").stat().st_size}
    _assert_whole(tmp_path / "hub", "org/tiny", newer)
    assert read_manifest(tmp_path / "hub", "org/tiny", old_commit) is not None  # the old snapshot stays


@pytest.mark.parametrize("lie", ["path", "blob id", "sha256", "commit"])
def test_a_hostile_hub_never_makes_the_download_write_outside_the_cache(hub, zoo_folder, tmp_path, lie) -> None:
    """A hub or mirror (HF_ENDPOINT) names the files, their blobs and the commit: names that climb out of the
    cache ("../..") are refused in one sentence before any byte moves, and nothing lands outside the cache."""
    stub = hub.add("org/evil", zoo_folder)
    climb = "../../../../escaped"
    weights, config = stub.files["model.safetensors"], stub.files["config.json"]
    if lie == "path":
        stub.files[climb] = dataclasses.replace(config, path=climb)
        hub.answer_any = config  # the URL of "../.." names no file the stub knows: a hostile mirror answers anyway
    elif lie == "blob id":
        stub.files["config.json"] = dataclasses.replace(config, blob_id=climb)
    elif lie == "sha256":
        stub.files["model.safetensors"] = dataclasses.replace(weights, sha256=climb)
    else:
        stub.refs["main"] = stub.commit = "../../../../escaped"
        hub.answer_any = config
    work = tmp_path / "work"
    work.mkdir()
    sentence = _one_sentence(download(work, hub.url, "org/evil"))
    assert "org/evil" in sentence and "refused, nothing fetched" in sentence and "HF_ENDPOINT" in sentence, sentence
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    assert not [p for p in work.rglob("*escaped*")]
    assert not [q for q in hub.served.requests if q["method"] == "GET" and "/resolve/" in q["path"]]


def test_a_second_download_while_one_runs_is_refused_and_the_first_finishes_whole(hub, zoo_folder, tmp_path) -> None:
    """Two terminals, one model: both appending to the same partial file would corrupt it (and two progress
    files in one run dir would overwrite each other), so the second says who runs and leaves."""
    weights = (zoo_folder / "model.safetensors").stat().st_size
    hub.hold(weights // 2)
    first = subprocess.Popen([str(REPO / "launch.sh"), "download", "org/tiny"], cwd=REPO, env=_env(tmp_path, hub.url),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        hub.wait_served(weights // 2, path="model.safetensors", timeout=TIMEOUT)
        second = subprocess.run([str(REPO / "launch.sh"), "download", "org/tiny"], cwd=REPO,
                                env=_env(tmp_path, hub.url), capture_output=True, text=True, timeout=30)
        sentence = _one_sentence(second)
        assert "another download" in sentence and f"pid {first.pid}" in sentence, sentence
    finally:
        hub.release()
        _, err = first.communicate(timeout=TIMEOUT)
    assert first.returncode == 0, err
    assert hub.served.bytes["model.safetensors"] == weights
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder)


def test_a_connection_reset_mid_file_resumes_from_what_arrived(hub, zoo_folder, tmp_path) -> None:
    """A link that drops mid-file (a reset, a stalled read that times out) is picked up where it stopped:
    the download ends whole, asking only for the bytes it lacked."""
    weights = (zoo_folder / "model.safetensors").stat().st_size
    hub.cut_at = weights // 2
    r = download(tmp_path, hub.url, "org/tiny")
    assert r.returncode == 0, r.stderr
    gets = [q for q in hub.served.requests if q["file"] == "model.safetensors" and q["method"] == "GET" and q["status"] != 302]
    assert [q["range"] for q in gets][0] is None and len(gets) == 2
    # a reset drops what sat unread in the receiver's buffers: the rerun starts where the disk stopped
    resumed = int(gets[1]["range"].removeprefix("bytes=").removesuffix("-"))
    assert 0 < resumed <= weights // 2
    assert hub.served.bytes["model.safetensors"] == weights + weights // 2 - resumed
    _assert_whole(tmp_path / "hub", "org/tiny", zoo_folder)


@pytest.mark.parametrize("repo", ["org/shaped", "org/shaped-lfs"])
def test_huggingface_hubs_own_snapshot_download_and_ours_agree_byte_for_byte(hub, shaped, tmp_path, repo) -> None:
    """The stand-in answers what huggingface_hub asks (repo info, tree, HEAD, the CDN redirect, Range), so a
    real-shaped repo (LFS shards whose blobId is their pointer's) is fetched by the code mlx-lm uses; ours
    writes the same layout with the same bytes, moving each byte once, and the token never reaches the CDN."""
    revision = "main" if repo == "org/shaped" else hub.repos[repo].commit  # a branch, and a commit
    hf_snapshot(tmp_path, hub.url, tmp_path / "theirs", repo, revision, HF_TOKEN=TOKEN)
    hub.reset()
    r = download(tmp_path, hub.url, repo, "--revision", revision, HF_TOKEN=TOKEN)
    assert r.returncode == 0, r.stderr
    assert _layout(tmp_path / "hub", repo) == _layout(tmp_path / "theirs", repo)
    _assert_whole(tmp_path / "hub", repo, shaped, revision)
    assert hub.served.total == _unique_bytes(hub, repo) < sum(f.size for f in hub.repos[repo].files.values())
    assert hub.requests_on("cdn") and {q["authorization"] for q in hub.requests_on("cdn")} == {None}


def test_identical_files_are_fetched_once_and_linked_from_every_path(hub, shaped, tmp_path) -> None:
    """tokenizer.json and original/tokenizer.json share one blob: one fetch, two links (two fetches of it
    appended to the same partial and renamed it under each other)."""
    small = tmp_path / "small"
    small.mkdir()
    for name in ("config.json", "tokenizer.json"):
        shutil.copyfile(shaped / name, small / name)
    (small / "original").mkdir()
    shutil.copyfile(shaped / "tokenizer.json", small / "original" / "tokenizer.json")
    hub.add("org/twins", small)
    r = download(tmp_path, hub.url, "org/twins")
    assert r.returncode == 0, r.stderr
    assert hub.served.total == _unique_bytes(hub, "org/twins")
    snap = _assert_whole(tmp_path / "hub", "org/twins", small)
    assert (snap / "tokenizer.json").resolve() == (snap / "original" / "tokenizer.json").resolve()


def test_a_rerun_replaces_a_damaged_file_without_removing_anything_served(hub, shaped, tmp_path) -> None:
    """A model fetched by huggingface_hub (and served as it is), one shard's bytes damaged: our download checks
    it against the hub's hashes, fetches that shard into a new partial and, killed half-way, has deleted nothing;
    the next run finishes it; the one after moves no byte and touches no file."""
    cache = tmp_path / "hub"
    hf_snapshot(tmp_path, hub.url, cache, "org/shaped", "main")
    shard = "model-00002-of-00003.safetensors"
    size = (shaped / shard).stat().st_size
    flip_a_byte(find_snapshot(cache, "org/shaped") / shard)
    served = _stats(cache, "org/shaped")
    hub.reset()
    hub.hold(size // 2)
    proc = subprocess.Popen([str(REPO / "launch.sh"), "download", "org/shaped"], cwd=REPO, env=_env(tmp_path, hub.url),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        hub.wait_served(size // 2, path=shard, timeout=TIMEOUT)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        hub.release()
    left = _stats(cache, "org/shaped")
    assert {k: v for k, v in left.items() if not k.endswith(".incomplete")} == served
    assert set(hub.served.bytes) == {shard}  # only the damaged file was asked for again

    hub.reset()
    r = download(tmp_path, hub.url, "org/shaped")
    assert r.returncode == 0, r.stderr
    assert set(hub.served.bytes) == {shard} and hub.served.total <= size
    _assert_whole(cache, "org/shaped", shaped)
    whole = _stats(cache, "org/shaped")
    hub.reset()
    r = download(tmp_path, hub.url, "org/shaped")
    assert r.returncode == 0, r.stderr
    assert hub.served.total == 0 and _stats(cache, "org/shaped") == whole


def test_a_hub_sending_more_than_it_announced_never_fills_the_disk(hub, shaped, tmp_path) -> None:
    """Reading stops at the announced size: 64 MB more than a shard's size on a "disk" of 8 MB per file is never
    written; a listing announcing fewer bytes than the file has is refused after a second try, nothing kept."""
    shard = "model-00001-of-00003.safetensors"
    hub.overflow = {shard: 64 * 2**20}
    r = download(tmp_path, hub.url, "org/shaped", fsize=8 * 2**20)
    assert r.returncode == 0, r.stderr
    _assert_whole(tmp_path / "hub", "org/shaped", shaped)
    hub.add("org/liar", shaped, api_sizes={shard: 1000})
    r = download(tmp_path, hub.url, "org/liar", fsize=8 * 2**20)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert shard in last and "more bytes than it announced" in last and "HF_ENDPOINT" in last, last
    blobs = repo_folder(tmp_path / "hub", "org/liar") / "blobs"
    assert not list(blobs.glob("*.incomplete")) and max(p.stat().st_size for p in blobs.iterdir()) < 2**20


def test_weights_the_cdn_lacks_name_the_cdn_and_leave_the_model_unusable(hub, shaped, tmp_path) -> None:
    """A shard whose redirect leads to a 404: the sentence names the host that answered (the CDN, not
    HF_ENDPOINT), and the snapshot left behind (config.json and all) is neither complete nor switchable."""
    shard = "model-00003-of-00003.safetensors"
    hub.cdn_missing = {shard}
    r = download(tmp_path, hub.url, "org/shaped")
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert f"{hub.cdn_url} answered HTTP 404 for {shard} of org/shaped" in last, last
    commit = hub.repos["org/shaped"].commit
    assert find_snapshot(tmp_path / "hub", "org/shaped", commit) is not None  # config.json is there
    [listed] = scan(tmp_path / "hub")
    assert not listed.complete
    r = subprocess.run([str(REPO / "launch.sh"), "switch", f"org/shaped@{commit}"], cwd=REPO, capture_output=True,
                       text=True, env=_env(tmp_path, hub.url, ENV_FILE=str(tmp_path / "env")), timeout=TIMEOUT)
    assert r.returncode == 1 and "cannot switch to org/shaped" in r.stderr, r.stderr
