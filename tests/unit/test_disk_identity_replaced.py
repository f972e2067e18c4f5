"""The model's identity after its weights are replaced in place by other weights of the same size whose copy kept
the source's modification time (rsync -a, cp -p, tar x): a fine-tune of the same architecture has files of exactly
the same size, and reusing the old model's disk entries with it would answer wrong."""

from __future__ import annotations

import os
from pathlib import Path

from engine.diskcache.identity import model_identity


def test_weights_replaced_with_same_size_and_mtime_change_the_identity(tmp_path: Path) -> None:
    model, cache = tmp_path / "model", tmp_path / "cache"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama"}')
    weights = model / "model.safetensors"
    weights.write_bytes(b"A" * 4096)
    st = weights.stat()
    before = model_identity(model, cache_dir=cache)
    # the fine-tune arrives as a new file renamed over the old one, its mtime kept from where it was copied
    fresh = model / "incoming.tmp"
    fresh.write_bytes(b"B" * 4096)
    os.utime(fresh, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(fresh, weights)
    assert model_identity(model, cache_dir=cache) != before
