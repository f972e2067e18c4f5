"""The prefix cache's disk tier as an operator reads it: `./launch.sh status`'s line and /metrics, on the fake
engine's Info (the dashboard's card is checked in Chromium by tests/integration/test_prefix_disk.py)."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

import ipc
from ops.status import describe_info

BASE = dict(model="m", model_path="/m", context_length=4096, ranks=2, backend="ring", created=1, engine_pid=10)
# 3 GB read back in 1.5 s of reading, checking and rebuilding: 2 GB/s
DISK = dict(prompt_cache_disk_entries=12, prompt_cache_disk_bytes=300 << 20, prompt_cache_disk_cap_bytes=1 << 30,
            prompt_cache_disk_hits=5, prompt_cache_disk_restores=4, prompt_cache_disk_restore_failures=1,
            prompt_cache_disk_writes=20, prompt_cache_disk_evictions=8, prompt_cache_disk_bytes_restored=3_000_000_000,
            prompt_cache_disk_seconds_restoring=1.5)


def disk_line(**kw) -> str:
    return next(ln for ln in describe_info(ipc.Info(**BASE, **kw)).splitlines() if ln.startswith("  disk cache"))


def test_status_shows_the_restore_rate_writes_and_evictions():
    assert disk_line(**DISK) == ("  disk cache 12 entries, 300.0 MiB of 1.00 GiB on rank 0; 5 hits, 4 restores, "
                                 "1 restore failures, restore rate 2.00 GB/s; 20 writes, 8 evictions")


def test_status_says_no_rate_before_the_first_restore():
    fresh = {**DISK, "prompt_cache_disk_hits": 0, "prompt_cache_disk_restores": 0,
             "prompt_cache_disk_restore_failures": 0, "prompt_cache_disk_bytes_restored": 0,
             "prompt_cache_disk_seconds_restoring": 0.0}
    assert "0 restores, 0 restore failures, restore rate –; 20 writes, 8 evictions" in disk_line(**fresh)
    assert disk_line().startswith("  disk cache off (PROMPT_CACHE_DISK_BYTES=0")


@pytest.mark.anyio
async def test_metrics_carry_both_halves_of_the_restore_rate(engine, client):
    engine.info = msgspec.structs.replace(engine.info, **DISK)
    s = {x.name: x.value for f in text_string_to_metric_families((await client.get("/metrics")).text)
         for x in f.samples}
    assert s["mcs_prompt_cache_disk_bytes_restored_total"] / s["mcs_prompt_cache_disk_seconds_restoring_total"] == 2e9
    assert (s["mcs_prompt_cache_disk_writes_total"], s["mcs_prompt_cache_disk_evictions_total"]) == (20, 8)
    assert (s["mcs_prompt_cache_disk_cap_bytes"], s["mcs_prompt_cache_disk_entries"]) == (1 << 30, 12)
