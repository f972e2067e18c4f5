"""The cache layout every rank, `download`, `models` and the engine agree on (config/hub_cache.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from config import ConfigError
from config.hub_cache import (Manifest, ManifestFile, find_snapshot, is_repo_id, missing_files, read_manifest,
                              scan, sha256_file, snapshot_folder, write_manifest)
from config.settings import load_settings

COMMIT = "a" * 40


def _model(cache: Path, files: dict[str, bytes], manifest: bool = True) -> Manifest:
    snap = snapshot_folder(cache, "org/tiny", COMMIT)
    for name, data in files.items():
        (snap / name).parent.mkdir(parents=True, exist_ok=True)
        (snap / name).write_bytes(data)
    m = Manifest(repo="org/tiny", revision="main", commit=COMMIT,
                 files=tuple(ManifestFile(n, len(d), sha256_file(snap / n)) for n, d in files.items()))
    if manifest:
        write_manifest(cache, m)
    else:
        (cache / "models--org--tiny" / "refs").mkdir(parents=True, exist_ok=True)
        (cache / "models--org--tiny" / "refs" / "main").write_text(COMMIT)
    return m


def test_a_whole_model_is_found_listed_complete_and_its_manifest_reads_back(tmp_path: Path) -> None:
    m = _model(tmp_path, {"config.json": b"{}", "model.safetensors": b"x" * 100})
    assert read_manifest(tmp_path, "org/tiny") == m
    assert find_snapshot(tmp_path, "org/tiny") == snapshot_folder(tmp_path, "org/tiny", COMMIT)
    [listed] = scan(tmp_path)
    assert (listed.repo, listed.complete, listed.size, listed.total, listed.revisions) == ("org/tiny", True, 102, 102, ["main"])


def test_a_short_or_missing_file_makes_the_model_incomplete_and_is_named(tmp_path: Path) -> None:
    m = _model(tmp_path, {"config.json": b"{}", "a.safetensors": b"x" * 100, "b.safetensors": b"y" * 10})
    snap = snapshot_folder(tmp_path, "org/tiny", COMMIT)
    (snap / "a.safetensors").write_bytes(b"x" * 50)
    (snap / "b.safetensors").unlink()
    assert missing_files(tmp_path, m) == ["a.safetensors", "b.safetensors"]
    [listed] = scan(tmp_path)
    assert not listed.complete and listed.size == 2 and listed.total == 112


def test_a_model_without_a_manifest_is_listed_by_what_is_there_and_never_complete(tmp_path: Path) -> None:
    """Another tool's download, or one of ours that failed half-way (a hash mismatch, a 404): config.json and no
    partial blob say nothing about the weights' bytes, so only a manifest (written once they matched) says whole."""
    _model(tmp_path, {"config.json": b"{}", "w.safetensors": b"z" * 7}, manifest=False)
    [listed] = scan(tmp_path)
    assert not listed.complete and not listed.manifest and listed.size == 9


@pytest.mark.parametrize("text", ["", "[]", '{"repo": "a/b"}', '{"repo":"a/b","revision":"main","commit":"c",'
                                  '"files":[{"path":"../x","size":1,"sha256":"0"}]}'])
def test_a_broken_or_escaping_manifest_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        Manifest.from_json(text)


@pytest.mark.parametrize("field, value", [("commit", "../../x"), ("commit", "main"), ("path", "/etc/x"),
                                          ("path", "a//b"), ("path", "a/./b"), ("sha256", "../../../x"),
                                          ("sha256", "A" * 64)])
def test_a_manifest_whose_names_would_climb_out_of_the_cache_is_refused(field: str, value: str) -> None:
    """A spread's ranks make folders and files of the commit, the paths and the sha256s a manifest names."""
    doc = {"repo": "a/b", "revision": "main", "commit": "c" * 40,
           "files": [{"path": "config.json", "size": 2, "sha256": "0" * 64}]}
    Manifest.from_json(json.dumps(doc))
    if field == "commit":
        doc["commit"] = value
    else:
        doc["files"][0][field] = value
    with pytest.raises(ValueError):
        Manifest.from_json(json.dumps(doc))


def test_repo_ids_are_org_slash_name_only() -> None:
    assert is_repo_id("mlx-community/Qwen3-4B-4bit")
    assert not any(map(is_repo_id, ["demo-tiny", "/abs/path", "./rel", "a/b/c", "a/..", "~/x"]))


def test_per_rank_caches_need_one_folder_per_rank(tmp_path: Path) -> None:
    env = {"HOSTS": "127.0.0.1,127.0.0.1", "HUB_CACHE_PER_RANK": f"{tmp_path}/r0,{tmp_path}/r1"}
    s = load_settings(env, tmp_path / ".env")
    assert (s.hub_cache(0), s.hub_cache(1)) == (tmp_path / "r0", tmp_path / "r1")
    with pytest.raises(ConfigError, match="one folder per rank"):
        load_settings({**env, "HUB_CACHE_PER_RANK": f"{tmp_path}/r0"}, tmp_path / ".env")
