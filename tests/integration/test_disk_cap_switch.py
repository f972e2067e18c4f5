"""PROMPT_CACHE_DISK_BYTES after a `switch`: each model's entries live in a folder of their own under
PROMPT_CACHE_DIR, and a switch away keeps them for the switch back; the byte cap still holds for the whole folder
(switching between five models must not leave five caps of files on the disk)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.disk_tier import open_in_background
from tests.integration.test_disk_tier import entry, size_of_one


def open_tier(root: Path, model: Path, cap: int):
    settings = SimpleNamespace(PROMPT_CACHE_DISK_BYTES=cap, PROMPT_CACHE_BYTES=-1, prompt_cache_dir=root, kv_bits=None,
                               KV_GROUP_SIZE=64)
    loaded = SimpleNamespace(path=str(model), parallel="tensor", pipeline_split=[])
    opened, done = [], threading.Event()
    thread = open_in_background(settings, loaded, 0, 1, lambda tier: (opened.append(tier), done.set()))
    thread.join(30)
    assert opened, "the tier did not open"
    return opened[0]


def model(folder: Path, weights: bytes) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(weights)
    return folder


def test_switching_models_keeps_the_whole_folder_under_the_cap(tmp_path: Path) -> None:
    one = size_of_one(tmp_path)
    root, cap = tmp_path / "prompt-cache", 3 * one + 4096
    for m in range(3):  # switch through three models, each conversation filling its cap
        tier = open_tier(root, model(tmp_path / f"model-{m}", bytes([m]) * 64), cap)
        for i in range(3):
            tier.put(f"m{m}-{i}", entry(10 * m + i), {"tokens": [i]})
            assert tier.flush(30)
        tier.close()
    held = sum(p.stat().st_size for p in root.rglob("*.kv"))
    assert held <= cap, f"{held} bytes of entries under a cap of {cap}"
    back = open_tier(root, tmp_path / "model-1", cap)  # the switch back finds the last entry it used
    assert "m1-2" in back.names()
    back.close()


def test_an_unwritable_prompt_cache_dir_warns_once_naming_it(tmp_path: Path, caplog) -> None:
    root = tmp_path / "not-a-folder"
    root.write_text("")  # PROMPT_CACHE_DIR names a file: nothing can be made under it (as a folder without access)
    settings = SimpleNamespace(PROMPT_CACHE_DISK_BYTES=1 << 20, PROMPT_CACHE_BYTES=-1, prompt_cache_dir=root,
                               kv_bits=None, KV_GROUP_SIZE=64)
    loaded = SimpleNamespace(path=str(model(tmp_path / "m", b"w" * 64)), parallel="tensor", pipeline_split=[])
    with caplog.at_level(logging.WARNING):
        open_in_background(settings, loaded, 0, 1, lambda tier: pytest.fail("opened")).join(30)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "PROMPT_CACHE_DIR" in warning and "weights" not in warning
