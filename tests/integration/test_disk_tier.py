"""One rank's disk tier (engine/diskcache/tier.py) on real MLX caches and a real folder: the byte cap holds under
more writes than it takes and keeps what was used last (across a restart too), a damaged or missing file is a miss
that deletes it, a full disk stops the spilling with one warning and never an error, a writer that falls behind
costs skipped entries rather than a stalled step, and everything on disk is private."""

from __future__ import annotations

import errno
import logging
import os
import threading
from pathlib import Path

import mlx.core as mx
from mlx_lm.models.cache import KVCache

from engine.diskcache import files, tier
from engine.diskcache.tier import DiskTier

TOKENS = 16


def entry(seed: int) -> list[KVCache]:
    c = KVCache()
    k = mx.random.normal((1, 2, TOKENS, 32), key=mx.random.key(seed))
    c.update_and_fetch(k, -k)
    c.keys, c.values = c.keys[..., :TOKENS, :], c.values[..., :TOKENS, :]  # as the RAM tier compacts it
    return [c]


def size_of_one(tmp_path: Path) -> int:
    return files.write_file(tmp_path / "probe.kv", files.host_copy(entry(0)), {"tokens": [0]})


def on_disk(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.iterdir())


def test_the_cap_holds_and_keeps_the_most_recently_used_across_a_restart(tmp_path: Path) -> None:
    one = size_of_one(tmp_path)
    cap = 3 * one + one // 2  # room for three
    folder = tmp_path / "tier"
    disk = DiskTier(folder, cap)
    for i in range(10):
        disk.put(f"e{i}", entry(i), {"tokens": [i]})
        assert disk.flush(30)
        if i == 8:
            assert disk.load("e6") is not None  # used again: kept over the newer e7
        assert on_disk(folder) <= cap and disk.stats()["bytes"] == on_disk(folder)
    assert disk.names() == ["e8", "e6", "e9"] and disk.stats()["evictions"] == 7  # ten written, three kept
    disk.put("huge", entry(1) * 4, {"tokens": []})  # larger than the cap: never written
    assert disk.flush(30) and "huge" not in disk.names()
    assert disk.load("e8") is not None
    disk.close()
    again = DiskTier(folder, cap)  # a restart finds the files, oldest use first
    assert again.names() == ["e6", "e9", "e8"]
    assert dict(again.scan()) == {"e6": {"tokens": [6]}, "e8": {"tokens": [8]}, "e9": {"tokens": [9]}}
    restored = again.load("e6")
    assert mx.array_equal(restored[0].keys, entry(6)[0].keys).item()
    again.put("e10", entry(10), {"tokens": [10]})
    assert again.flush(30) and again.names() == ["e8", "e6", "e10"]
    stats = again.stats()
    assert (stats["entries"], stats["restores"], stats["bytes_restored"]) == (3, 1, one)
    again.close()


def test_a_damaged_or_missing_file_is_a_miss_and_the_damaged_file_is_deleted(tmp_path: Path, caplog) -> None:
    disk = DiskTier(tmp_path, 1 << 20)
    for i in range(3):
        disk.put(f"e{i}", entry(i), {"tokens": [i]})
    assert disk.flush(30)
    header = tmp_path / "e2.kv"
    data = bytearray(header.read_bytes())
    data[20] ^= 1  # in its header: a start-up's scan drops it
    header.write_bytes(bytes(data))
    assert dict(disk.scan()) == {"e0": {"tokens": [0]}, "e1": {"tokens": [1]}} and not header.exists()
    path = tmp_path / "e0.kv"
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    assert disk.load("e0") is None and not path.exists() and disk.names() == ["e1"]
    assert "fails its checksum" in caplog.text
    (tmp_path / "e1.kv").unlink()  # gone behind the tier's back (another process, an operator)
    assert disk.load("e1") is None and disk.load("never") is None
    assert disk.stats()["restore_failures"] == 3 and disk.stats()["restores"] == 0
    disk.close()


def test_a_full_disk_stops_spilling_with_one_warning_and_no_error(tmp_path: Path, monkeypatch, caplog) -> None:
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    disk = DiskTier(tmp_path, 1 << 20)
    disk.put("before", entry(0), {})
    assert disk.flush(30)
    monkeypatch.setattr(tier.files, "write_file", full)
    with caplog.at_level(logging.WARNING, logger="engine.diskcache.tier"):
        for i in range(5):
            disk.put(f"e{i}", entry(i), {})
            assert disk.flush(30)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "the disk is full" in warnings[0].getMessage()
    stats = disk.stats()
    assert (stats["write_failures"], stats["skipped"], stats["writes"]) == (1, 4, 1)
    assert disk.names() == ["before"] and disk.load("before") is not None  # what is on disk still serves
    disk.close()


def test_a_writer_behind_skips_entries_and_a_delete_cancels_a_queued_write(tmp_path: Path, monkeypatch) -> None:
    writing, release, real = threading.Event(), threading.Event(), files.write_file

    def slow(*args):
        writing.set()
        release.wait(30)
        return real(*args)

    monkeypatch.setattr(tier.files, "write_file", slow)
    disk = DiskTier(tmp_path, 1 << 20, queue_entries=2)
    disk.put("e0", entry(0), {})
    assert writing.wait(30)
    for i in range(1, 5):  # e0 being written, two queued, two skipped: put never waits for the disk
        disk.put(f"e{i}", entry(i), {})
    assert disk.stats()["skipped"] == 2
    queued = disk.load("e2")  # not on disk yet: served from its host copy
    assert queued is not None and mx.array_equal(queued[0].values, entry(2)[0].values).item()
    disk.delete("e1")
    release.set()
    assert disk.flush(30)
    assert sorted(disk.names()) == ["e0", "e2"] and sorted(p.name for p in tmp_path.iterdir()) == ["e0.kv", "e2.kv"]
    disk.close()


def test_the_folder_and_files_are_private_and_a_crashs_leftovers_are_removed(tmp_path: Path) -> None:
    folder = tmp_path / "tier"
    folder.mkdir(mode=0o755)
    os.chmod(folder, 0o755)
    (folder / "e0.kv.4242.tmp").write_bytes(b"half an entry")
    disk = DiskTier(folder, 1 << 20)
    disk.put("e1", entry(1), {})
    assert disk.flush(30)
    assert folder.stat().st_mode & 0o777 == 0o700
    assert [(p.name, p.stat().st_mode & 0o777) for p in folder.iterdir()] == [("e1.kv", 0o600)]
    disk.close()


def test_a_cap_of_zero_writes_nothing(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, 0)
    disk.put("e0", entry(0), {})
    assert disk.flush(30) and not list(tmp_path.iterdir()) and disk.stats()["skipped"] == 1
    disk.close()


def test_an_entry_it_cannot_write_costs_that_entry_only(tmp_path: Path, caplog) -> None:
    from mlx_lm.models.cache import BatchKVCache

    disk = DiskTier(tmp_path, 1 << 20)
    with caplog.at_level(logging.WARNING, logger="engine.diskcache.tier"):
        disk.put("batch", [BatchKVCache([0])], {})  # a batch's kind never reaches the prefix cache
        disk.put("odd", entry(0), {"tokens": object()})  # a header msgpack cannot encode
        disk.put("fine", entry(1), {"tokens": [1]})
        assert disk.flush(30)
    assert disk.names() == ["fine"] and disk.load("fine") is not None
    stats = disk.stats()
    assert (stats["skipped"], stats["write_failures"], stats["writes"]) == (1, 1, 1)
    assert "BatchKVCache" in caplog.text
    disk.close()


def test_without_a_copy_a_queued_entry_outlives_the_callers_arrays(tmp_path: Path) -> None:
    disk = DiskTier(tmp_path, 1 << 20, copy=False)
    layers = entry(3)
    disk.put("e3", layers, {})
    del layers  # the RAM tier evicted it before the writer ran: the views keep its arrays
    assert disk.flush(30)
    back = disk.load("e3")
    assert back is not None and mx.array_equal(back[0].keys, entry(3)[0].keys).item()
    disk.close()
