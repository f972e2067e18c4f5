"""A prefix-cache entry written to one file and read back (engine/diskcache/files.py), on real MLX caches without
the engine: for every cache kind the zoo's models keep (plain KV, MLA's latent, sliding windows past their wrap,
linear attention's state, each quantized where KV_BITS takes it, bfloat16 too), the restored entry extended by the
next turn's tokens gives exactly the logits the original entry gives; and a file damaged in any way is refused."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import CacheList, KVCache, RotatingKVCache, make_prompt_cache

from engine.diskcache.files import VERSION, DamagedEntry, host_copy, read_file, read_header, write_file
from engine.kvquant.kinds import install
from engine.lockstep.prefix import compact
from engine.zoo.configs import WINDOW
from engine.zoo.wide import wide_model

PROMPT = [(7 * i) % 250 + 2 for i in range(WINDOW + 13)]  # past the sliding windows: they have wrapped
NEXT = [5, 9, 11, 3]
HEADER = {"tokens": PROMPT, "tenant": "team-a", "length": len(PROMPT)}
# (family, KV_BITS, dtype): every cache kind of the zoo, stored as the RAM tier stores it
CASES = [(f, None, "float32") for f in ("llama", "qwen3.5", "qwen3-next", "deepseek-v3", "gpt-oss", "ministral3")]
CASES += [(f, 8, "float32") for f in ("llama", "qwen3.5", "deepseek-v3", "ministral3")]
CASES += [("llama", None, "bfloat16"), ("ministral3", 4, "bfloat16"), ("qwen3.5", 8, "bfloat16")]


def _entry(family: str, bits: int | None, dtype: str):
    mx.random.seed(0)
    model = wide_model(family)
    model.set_dtype(getattr(mx, dtype))
    install(model, bits, 64)
    cache = make_prompt_cache(model)
    mx.eval(model(mx.array([PROMPT]), cache=cache))
    return model, compact(cache, len(PROMPT))  # what the RAM tier keeps


def _kinds(cache) -> list[str]:
    return [type(c).__name__ + (str(_kinds(c.caches)) if isinstance(c, CacheList) else "") for c in cache]


@pytest.mark.parametrize(("family", "bits", "dtype"), CASES, ids=[f"{f}-{b or 'full'}-{d}" for f, b, d in CASES])
def test_a_restored_entry_extended_by_the_next_turn_gives_the_original_entrys_logits(family, bits, dtype,
                                                                                     tmp_path: Path) -> None:
    model, entry = _entry(family, bits, dtype)
    path = tmp_path / "e.kv"
    assert write_file(path, host_copy(entry), HEADER) == path.stat().st_size
    restored, header = read_file(path)
    assert header == HEADER and read_header(path) == HEADER
    assert _kinds(restored) == _kinds(entry)
    assert sum(c.nbytes for c in restored) == sum(c.nbytes for c in entry)
    want = model(mx.array([NEXT]), cache=entry)
    got = model(mx.array([NEXT]), cache=restored)
    assert got.dtype == want.dtype and mx.array_equal(got, want).item()


def test_nested_caches_come_back_with_their_positions(tmp_path: Path) -> None:
    window = RotatingKVCache(max_size=8, keep=2)
    keys = mx.random.normal((1, 2, 11, 4))
    window.update_and_fetch(keys, keys + 1)  # past its size: wrapped
    plain = KVCache()
    plain.update_and_fetch(mx.ones((1, 2, 3, 4), mx.float16), mx.zeros((1, 2, 3, 4), mx.float16))
    write_file(tmp_path / "n.kv", host_copy([CacheList(plain, window)]), {})
    (back,), _ = read_file(tmp_path / "n.kv")
    (p, w) = back.caches
    assert (w.offset, w._idx, w.max_size, w.keep, p.offset) == (window.offset, window._idx, 8, 2, 3)
    assert mx.array_equal(w.keys, window.keys).item() and mx.array_equal(p.values, plain.values).item()


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> bytes:
    _, entry = _entry("qwen3.5", None, "float32")  # arrays of several kinds, Nones among them
    path = tmp_path_factory.mktemp("w") / "e.kv"
    write_file(path, host_copy(entry), HEADER)
    return path.read_bytes()


def _damaged(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "d.kv"
    path.write_bytes(data)
    return path


def test_a_file_cut_short_anywhere_is_refused(written: bytes, tmp_path: Path) -> None:
    for n in (0, 5, 20, len(written) // 3, len(written) - 1):
        with pytest.raises(DamagedEntry):
            read_file(_damaged(tmp_path, written[:n]))


def test_one_flipped_byte_anywhere_is_refused(written: bytes, tmp_path: Path) -> None:
    for at in [*range(0, 64, 3), *range(64, len(written), max(1, len(written) // 97)), len(written) - 1]:
        flipped = bytearray(written)
        flipped[at] ^= 0x10
        with pytest.raises(DamagedEntry):
            read_file(_damaged(tmp_path, bytes(flipped)))


def test_another_format_version_or_no_file_is_refused(written: bytes, tmp_path: Path) -> None:
    other = bytearray(written)
    struct.pack_into("<H", other, 6, VERSION + 1)
    path = _damaged(tmp_path, bytes(other))
    with pytest.raises(DamagedEntry, match="version"):
        read_header(path)
    with pytest.raises(DamagedEntry, match="not a prefix-cache file"):
        read_file(_damaged(tmp_path, b"PK\x03\x04" + written[4:]))
    with pytest.raises(DamagedEntry):
        read_file(tmp_path / "absent.kv")


def test_files_are_private_and_written_whole(tmp_path: Path) -> None:
    old = os.umask(0)  # even a permissive umask leaves the files and folders private
    try:
        path = tmp_path / "deeper" / "e.kv"
        write_file(path, host_copy([]), {"tokens": []})
    finally:
        os.umask(old)
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)
    assert sorted(p.name for p in path.parent.iterdir()) == ["e.kv"]  # no tmp file left
