"""Two engines given the same PROMPT_CACHE_DIR (same model, layout and precision) at once: the second one's start
must not break the first one's spilling, and the folder must stay under the per-rank byte cap."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


from engine.diskcache import files
from engine.diskcache.tier import DiskTier
from tests.integration.test_disk_tier import entry, on_disk, size_of_one


def test_a_second_engine_starting_keeps_the_first_engines_write_in_flight(tmp_path: Path) -> None:
    folder = tmp_path / "tier"
    folder.mkdir(mode=0o700)
    # another live process is writing an entry: write_file's tmp name carries its pid
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        tmp = folder / f"abc.kv.{other.pid}.tmp"
        tmp.write_bytes(b"x" * 100)
        DiskTier(folder, 1 << 20).close()
        assert tmp.exists(), "the other engine's rename now fails and it stops spilling until restarted"
    finally:
        other.kill()
        other.wait()


def test_two_engines_on_one_folder_hold_its_cap(tmp_path: Path) -> None:
    one = size_of_one(tmp_path)
    folder = tmp_path / "tier"
    cap = 3 * one
    a, b = DiskTier(folder, cap), DiskTier(folder, cap)
    for i in range(3):
        a.put(f"a{i}", entry(i), {"tokens": [i]})
        b.put(f"b{i}", entry(10 + i), {"tokens": [i]})
        assert a.flush(30) and b.flush(30)
    a.close()
    b.close()
    assert on_disk(folder) <= cap
