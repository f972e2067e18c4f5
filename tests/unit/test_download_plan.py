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
from ops.hub_fetch import RemoteFile, RemoteRepo, partial_path, pointer_path
from ops.layout import Die

Usage = namedtuple("Usage", "total used free")


def _remote(*files: RemoteFile) -> RemoteRepo:
    return RemoteRepo("org/m", "main", "c" * 40, files)


def test_hash_file_gives_the_sha256_and_gits_blob_id(tmp_path: Path) -> None:
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights\0" * 1000)
    seen = []
    sha256, blob_id = hash_file(f, seen.append)
    assert sum(seen) == 8000
    assert sha256 == subprocess.run(["sha256sum", str(f)], capture_output=True, text=True).stdout.split()[0]
    assert blob_id == subprocess.run(["git", "hash-object", str(f)], capture_output=True, text=True).stdout.strip()


def test_space_counts_only_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    here = RemoteFile("config.json", 10, "a" * 40)
    half = RemoteFile("model.safetensors", 1000, "b" * 64, sha256="b" * 64)
    remote = _remote(here, half)
    pointer = pointer_path(tmp_path, remote, here)
    pointer.parent.mkdir(parents=True)
    pointer.write_bytes(b"x" * 10)
    part = partial_path(tmp_path, "org/m", half)
    part.parent.mkdir(parents=True)
    part.write_bytes(b"y" * 400)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**6, 0, 600))
    check_space(tmp_path, remote)  # 600 bytes still to come, 600 free
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10**6, 0, 599))
    with pytest.raises(Die) as caught:
        check_space(tmp_path, remote)
    assert caught.value.code == 1
    sentence = str(caught.value)
    assert download.socket.gethostname() in sentence and "(600 bytes) needed" in sentence
    assert "(599 bytes) free" in sentence and "HUB_CACHE" in sentence


def test_space_is_checked_on_the_disk_of_a_cache_not_made_yet(tmp_path: Path, monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(shutil, "disk_usage", lambda p: asked.append(p) or Usage(10**6, 0, 10**6))
    check_space(tmp_path / "not" / "yet", _remote(RemoteFile("a", 5, "a" * 40)))
    assert asked == [tmp_path]


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
