"""The names that key the prefix cache's disk tier (engine/diskcache/identity.py): the model's identity follows its
weights' content, not its name, and costs nothing for a Hub snapshot; layouts, precisions and entries that would
make a reuse wrong get different names."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from engine.diskcache import identity
from engine.diskcache.identity import entry_name, layout_name, model_identity, precision_name

WEIGHTS = {"model-00001-of-00002.safetensors": b"first half of the weights",
           "model-00002-of-00002.safetensors": b"second half", "config.json": b'{"model_type": "llama"}'}


def plain(folder: Path, files: dict[str, bytes] = WEIGHTS) -> Path:
    folder.mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    (folder / "tokenizer.json").write_bytes(os.urandom(8))  # not the weights: never changes the identity
    return folder


def snapshot(cache: Path, files: dict[str, bytes] = WEIGHTS) -> Path:
    """A Hugging Face cache's layout: snapshots/<rev>/<file> links to blobs/<name>, the content's sha256 for an LFS
    file (the weights), git's blob sha1 for a small one."""
    blobs, folder = cache / "blobs", cache / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    folder.mkdir(parents=True)
    for name, data in files.items():
        lfs = name.endswith(".safetensors")
        blob = blobs / (hashlib.sha256(data) if lfs else hashlib.sha1(b"blob %d\0" % len(data) + data)).hexdigest()
        blob.write_bytes(data)
        (folder / name).symlink_to(os.path.relpath(blob, folder))
    return folder


def test_the_same_weights_anywhere_have_one_identity_and_other_weights_another(tmp_path: Path) -> None:
    a = model_identity(plain(tmp_path / "a"))
    assert a and a == model_identity(plain(tmp_path / "copy")) == model_identity(snapshot(tmp_path / "hub"))
    changed = WEIGHTS | {"model-00002-of-00002.safetensors": b"second half, fine-tuned"}
    assert model_identity(plain(tmp_path / "tuned", changed)) != a
    assert model_identity(plain(tmp_path / "rope", WEIGHTS | {"config.json": b'{"rope": 2}'})) != a
    assert model_identity(plain(tmp_path / "empty", {"config.json": b"{}"})) is None


def test_a_hub_snapshots_weights_are_never_read(tmp_path: Path, monkeypatch) -> None:
    folder = snapshot(tmp_path / "hub")
    read = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda p: read.append(p.name) or real(p))
    assert model_identity(folder)
    assert read == ["config.json"]  # a small file whose blob git names by sha1: read, the weights never


def test_plain_weights_are_hashed_once_and_again_only_when_they_change(tmp_path: Path, monkeypatch) -> None:
    folder, cache = plain(tmp_path / "m"), tmp_path / "cache"
    read = []
    real = identity._sha256
    monkeypatch.setattr(identity, "_sha256", lambda p: read.append(p.name) or real(p))
    first = model_identity(folder, cache)
    assert len(read) == 3 and (cache / identity.SIDECAR).stat().st_mode & 0o777 == 0o600
    assert model_identity(folder, cache) == first and len(read) == 3  # remembered: nothing read again
    (folder / "model-00001-of-00002.safetensors").write_bytes(b"first half of the weights, retrained")
    assert model_identity(folder, cache) != first and read[3:] == ["model-00001-of-00002.safetensors"]
    assert len(json.loads((cache / identity.SIDECAR).read_text())) == 4


def test_layouts_name_the_split_and_this_ranks_part() -> None:
    assert layout_name(1, 0, "single") == "r0"
    assert [layout_name(2, r, "tensor") for r in (0, 1)] == ["tp2.r0", "tp2.r1"]
    # mlx-lm's pipeline(): rank 0 runs the last layers
    assert [layout_name(2, r, "pipeline", [12, 12]) for r in (0, 1)] == ["pp2.r0.L12-23", "pp2.r1.L0-11"]
    assert layout_name(3, 1, "pipeline", [10, 8, 6]) == "pp3.r1.L6-13"
    with pytest.raises(ValueError):
        layout_name(2, 0, "single")


def test_precisions_and_entries_that_differ_get_different_names() -> None:
    assert (precision_name(None, 64), precision_name(0, 64), precision_name(8, 64), precision_name(4, 32)) == (
        "full", "full", "q8g64", "q4g32")
    names = {entry_name(t, toks) for t, toks in [("", [1, 2, 3]), ("a", [1, 2, 3]), ("b", [1, 2, 3]),
                                                 ("a", [1, 2]), ("a", [1, 2, 3, 0]), ("a", [258]), ("a", [2, 1])]}
    assert len(names) == 7
    assert entry_name("a", [1, 2, 3]) == entry_name("a", (1, 2, 3)) and len(entry_name("a", [])) == 40
