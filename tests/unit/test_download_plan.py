"""The download's pure parts: the hashes it compares with the hub's, the space it asks for, the hosts by rank."""

from __future__ import annotations

import shutil
import subprocess
from collections import namedtuple
from pathlib import Path

import pytest

from config import load_settings
from ops import download
from ops.download import check_space, hash_file, rank_hosts
from ops.hub_fetch import Blob, RemoteFile, RemoteRepo, blobs, partial_bytes, partial_path, verifies
from ops.layout import Die

Usage = namedtuple("Usage", "total used free")


def test_hash_file_gives_the_sha256_and_gits_blob_id(tmp_path: Path) -> None:
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights\0" * 1000)
    seen = []
    sha256, blob_id = hash_file(f, seen.append)
    assert sum(seen) == 8000
    assert sha256 == subprocess.run(["sha256sum", str(f)], capture_output=True, text=True).stdout.split()[0]
    assert blob_id == subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True).stdout.strip()


def test_space_counts_what_will_be_written_with_partials_resumed(tmp_path: Path, monkeypatch) -> None:
    half = Blob("b" * 64, (RemoteFile("model.safetensors", 1000, "b" * 64, sha256="b" * 64),))
    part = partial_path(tmp_path, "org/m", half.etag)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"y" * 400)
    assert partial_bytes(tmp_path, "org/m", half) == 400
    part.write_bytes(b"y" * 1001)  # longer than the file: not its beginning, fetched whole again
    assert partial_bytes(tmp_path, "org/m", half) == 0
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**6, 0, 600))
    check_space(tmp_path, "org/m", 600)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**6, 0, 599))
    with pytest.raises(Die) as caught:
        check_space(tmp_path, "org/m", 600)
    assert caught.value.code == 1
    sentence = str(caught.value)
    assert download.socket.gethostname() in sentence and "(600 bytes) needed" in sentence
    assert "(599 bytes) free" in sentence and "HUB_CACHE" in sentence


def test_space_is_checked_on_the_disk_of_a_cache_not_made_yet(tmp_path: Path, monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(shutil, "disk_usage", lambda p: asked.append(p) or Usage(10**6, 0, 10**6))
    check_space(tmp_path / "not" / "yet", "org/m", 5)
    assert asked == [tmp_path]


def test_a_file_is_checked_by_the_lfs_sha256_when_listed_else_by_its_git_blob_id() -> None:
    """The blobId of an LFS file is its pointer's git id: comparing the content's with it fails every shard."""
    weights = RemoteFile("w.safetensors", 5, "c" * 64, sha256="c" * 64, blob_id="p" * 40)
    assert verifies(weights, "c" * 64, "anything")
    assert not verifies(weights, "d" * 64, "p" * 40)
    config = RemoteFile("config.json", 2, "e" * 40, blob_id="e" * 40)
    assert verifies(config, "whatever", "e" * 40) and not verifies(config, "e" * 40, "f" * 40)


def test_identical_files_make_one_blob_with_every_path() -> None:
    a, b = RemoteFile("tokenizer.json", 9, "a" * 40, blob_id="a" * 40), RemoteFile("x/tokenizer.json", 9, "a" * 40)
    remote = RemoteRepo("org/m", "main", "c" * 40, (a, RemoteFile("config.json", 2, "e" * 40), b))
    assert [(blob.etag, [f.path for f in blob.files]) for blob in blobs(remote)] == [
        ("a" * 40, ["tokenizer.json", "x/tokenizer.json"]), ("e" * 40, ["config.json"])]


def test_rank_hosts_gives_one_name_per_rank() -> None:
    settings = load_settings({"HOSTS": "mac1,mac1,mac2"}, "/nonexistent/.env")
    assert rank_hosts(settings) == ["mac1", "mac1", "mac2"]


def test_a_folder_is_hashed_without_its_hidden_entries(tmp_path: Path) -> None:
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (model / "sub" / "w.safetensors").write_bytes(b"w" * 100)
    (model / ".cache" / "huggingface").mkdir(parents=True)
    (model / ".cache" / "huggingface" / "x.metadata").write_text("x")
    settings = load_settings({"RUN_DIR": str(tmp_path / "run")}, "/nonexistent/.env")
    manifest = download.folder_manifest(settings, model)
    assert manifest.repo == str(model) and manifest.commit == ""
    assert [(f.path, f.size) for f in manifest.files] == [("config.json", 2), ("sub/w.safetensors", 100)]


def test_a_folders_links_are_followed_only_inside_it_or_its_hub_snapshot(tmp_path: Path) -> None:
    """A link out of the folder would have its target (a key, /etc/...) copied to every rank: refused, named."""
    settings = load_settings({"RUN_DIR": str(tmp_path / "run")}, "/nonexistent/.env")
    repo = tmp_path / "models--org--m"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snap = repo / "snapshots" / ("c" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/abc")  # huggingface_hub's own layout: followed
    (snap / "same.json").symlink_to("config.json")
    manifest = download.folder_manifest(settings, snap)
    assert [(f.path, f.size) for f in manifest.files] == [("config.json", 2), ("same.json", 2)]
    secret = tmp_path / "secret"
    secret.write_text("key")
    (snap / "notes.txt").symlink_to(secret)
    with pytest.raises(Die) as caught:
        download.folder_manifest(settings, snap)
    assert caught.value.code == 1 and f"{snap / 'notes.txt'} is a link to {secret}" in str(caught.value)
    (snap / "notes.txt").unlink()
    (snap / "sub").symlink_to(tmp_path, target_is_directory=True)
    with pytest.raises(Die):
        download.folder_manifest(settings, snap)
