"""Memory budgets on a Mac: Metal wires at most its recommended working set (about 3/4 of RAM), so the KV and
prefix-cache budgets and the pipeline split count that, not RAM. No Metal here: the device info is injected."""

from __future__ import annotations

import pytest

from engine.rank0.kv_budget import memory_budget
from engine.rank0.prefix_index import prompt_cache_budget

GiB = 1 << 30
# what mx.device_info() says on a 128 GB Mac (iogpu.wired_limit_mb left alone), and on this Linux CPU
MAC = {"architecture": "applegpu_g15s", "device_name": "Apple M4 Max", "memory_size": 128 * GiB,
       "max_recommended_working_set_size": 96 * GiB}
CPU = {"architecture": "x86_64", "device_name": "AMD EPYC"}


@pytest.fixture
def ranks():
    """engine.ranks, imported by the tests that use it: importing the unit tests loads no MLX."""
    from engine import ranks

    return ranks


def mac_rank(ranks, active: int) -> list[int]:
    """A rank's report row as a 128 GB Mac holding `active` bytes of weights would send it."""
    row = ranks.local_row(0, info=MAC)
    row[2], row[5] = active // 1024, 128 * GiB // 1024  # its active memory and RAM, not this host's
    return row


def test_kv_and_prefix_budgets_stay_within_metals_working_set_not_ram(ranks):
    reports = ranks.RankReports(["mac-a", "mac-b"])
    reports.update([mac_rank(ranks, 80 * GiB), mac_rank(ranks, 70 * GiB)])
    states = reports.snapshot()
    assert [s.gpu_working_set for s in states] == [96 * GiB, 96 * GiB]
    # an 80 GB shard leaves 16 GB of the 96 GB Metal wires (RAM would say 48 GB, and the Mac would page)
    assert memory_budget(-1, states) == 8 * GiB
    assert prompt_cache_budget(-1, states) == 4 * GiB


def test_hosts_without_a_working_set_keep_counting_ram(ranks):
    assert ranks.gpu_working_set(CPU) == 0
    row = ranks.local_row(0, info=CPU)
    row[2], row[5] = 80 * GiB // 1024, 128 * GiB // 1024
    reports = ranks.RankReports(["linux"])
    reports.update([row])
    assert memory_budget(-1, reports.snapshot()) == 24 * GiB


def test_the_pipeline_split_weighs_ranks_by_the_same_figure(ranks, monkeypatch):
    monkeypatch.setattr(ranks, "host_memory", lambda: (128 * GiB, 50 * GiB))
    assert ranks.model_memory(MAC) == 96 * GiB
    assert ranks.model_memory(CPU) == 50 * GiB  # elsewhere what the OS says is available


def test_without_proc_meminfo_available_memory_comes_from_sysconf(ranks, monkeypatch):
    """macOS has no /proc/meminfo: what is available comes from sysconf's SC_AVPHYS_PAGES, never 0."""
    def no_meminfo(*args, **kwargs):
        raise FileNotFoundError("/proc/meminfo")
    monkeypatch.setattr(ranks, "open", no_meminfo, raising=False)
    monkeypatch.setattr(ranks.os, "sysconf", {"SC_PAGE_SIZE": 16384, "SC_PHYS_PAGES": 8 * GiB // 16384,
                                              "SC_AVPHYS_PAGES": 3 * GiB // 16384}.__getitem__)
    assert ranks.host_memory() == (8 * GiB, 3 * GiB)
