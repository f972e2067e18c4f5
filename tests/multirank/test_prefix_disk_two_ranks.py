"""The prefix cache's disk tier on two ranks: after a restart every rank restores its own shard of the last turn; a file
damaged on rank 1 only (one byte flipped) makes every rank compute the turn instead: the same answer, no rank dies,
and later turns go on as usual."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.harness import Stack, wait_for

pytestmark = pytest.mark.multirank

SYSTEM = " ".join(f"Rule {i}: answer briefly and cite file {i % 13}.py." for i in range(60))
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which file holds rule 5?"}]


def chat(stack: Stack, messages: list[dict], **kw) -> dict:
    r = httpx.post(stack.base_url + "/v1/chat/completions", timeout=300, json={
        "model": "default", "messages": messages, "max_tokens": 10, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def disk(stack: Stack) -> dict:
    info = stack.probe() or {}
    return {k.removeprefix("prompt_cache_disk_"): v for k, v in info.items() if k.startswith("prompt_cache_disk_")}


def flip_a_byte_of_rank_1s_entry(root) -> None:
    """Rank 1's folder (its layout ends in r1) holds the entry: flip one byte in the middle of its largest file."""
    folders = [p for p in root.rglob("*") if p.is_dir() and re.search(r"(^|\.)r1$", p.name)]
    assert len(folders) == 1, folders
    largest = max((p for p in folders[0].rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(largest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    largest.write_bytes(bytes(data))


def restart(s: Stack, engine):
    engine.stop()
    return s.start_engine(ranks=2)


def test_restores_on_two_ranks_and_a_file_damaged_on_one_rank_is_computed_on_every_rank_alike():
    s = Stack(extra={"PROMPT_CACHE_BYTES": str(64 << 20), "PROMPT_CACHE_DISK_BYTES": str(256 << 20)})
    engine, api = s.start_engine(ranks=2), s.start_api()
    try:
        wait_for(lambda: disk(s).get("cap_bytes"), 60, "the disk tier to open")
        one = chat(s, FIRST)
        wait_for(lambda: disk(s).get("entries"), 30, "turn one's entry on disk")
        engine = restart(s, engine)
        wait_for(lambda: disk(s).get("cap_bytes"), 60, "the restarted engine's disk tier")
        turn = FIRST + [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                        {"role": "user", "content": "And rule 6?"}]
        restored = chat(s, turn)  # every rank loads its own shard of turn one
        assert restored["usage"]["prompt_tokens_details"]["cached_tokens"] >= one["usage"]["prompt_tokens"] - 8
        assert disk(s)["restores"] == 1
        engine.stop()  # turn two's entry (superseding turn one's) is written on close
        flip_a_byte_of_rank_1s_entry(s.root / "prompt-cache")
        engine = s.start_engine(ranks=2)
        wait_for(lambda: disk(s).get("cap_bytes"), 60, "the restarted engine's disk tier")
        computed = chat(s, turn)  # the restore fails on rank 1 alone: every rank computes the turn
        assert computed["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        assert computed["choices"][0]["message"]["content"] == restored["choices"][0]["message"]["content"]
        after = disk(s)
        assert (after["restores"], after["restore_failures"]) == (0, 1)
        three = chat(s, turn + [{"role": "assistant", "content": computed["choices"][0]["message"]["content"]},
                                {"role": "user", "content": "And rule 7?"}])
        assert three["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        info = s.probe()
        assert info is not None and info["ranks"] == 2 and info["active"] == 0
    finally:
        api.stop()
        engine.stop()
