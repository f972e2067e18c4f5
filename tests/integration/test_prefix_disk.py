"""The prefix cache's disk tier on the real engine: a conversation's next turn after `restart-engine` restores what
the turn before computed (cached_tokens) and answers exactly as computing it does; another tenant finds none of it.
The dashboard's card (in Chromium) says no restore rate before the restore, and /health's rate after it."""

from __future__ import annotations

import os
import re

import httpx
import msgspec
import pytest

from ipc import Info
from ops.status import describe_info

from tests.harness import Stack, wait_for
from tests.integration.test_dashboard import CHROMIUM, chromium_page

KEY_A, KEY_B = "sk-disk-tenant-a-01", "sk-disk-tenant-b-02"
SYSTEM = " ".join(f"Rule {i}: keep the answer short, cite file {i % 17}.py and never guess." for i in range(40))
FIRST = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Which file holds rule 7?"}]


def chat(url: str, key: str, messages: list[dict]) -> dict:
    r = httpx.post(url + "/v1/chat/completions", timeout=300, headers={"Authorization": f"Bearer {key}"},
                   json={"model": "default", "messages": messages, "max_tokens": 10, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def disk(url: str) -> dict | None:
    """The disk tier's figures, as /health shows them (None while no engine, or no API, serves)."""
    try:
        r = httpx.get(url + "/health", timeout=10)
    except httpx.HTTPError:
        return None
    return r.json()["prompt_cache_disk"] if r.status_code == 200 else None


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text(f"{KEY_A}\n{KEY_B}\n")
    # the operator's routes open (/health's details, /metrics) with the tenants' keys set
    s = Stack(extra={"API_KEYS_FILE": str(keys), "PROMPT_CACHE_BYTES": str(64 << 20), "PROTECT_OPS_ROUTES": "false",
                     "PROMPT_CACHE_DISK_BYTES": str(256 << 20)})
    s.engine, s.api = s.start_engine(), s.start_api()
    yield s
    s.api.stop()
    s.engine.stop()


@pytest.fixture(scope="module")
def dashboard(stack):
    """disk_card() -> the dashboard's disk card text once its poll shows `wanted` (one browser for the module)."""
    with chromium_page() as (page, errors):

        def disk_card(wanted: str) -> str:
            page.goto(stack.base_url + "/dashboard")
            page.wait_for_function("w => document.getElementById('disk-sub').textContent.includes(w)", arg=wanted,
                                   timeout=15_000)
            assert not errors, errors
            return page.locator("#disk-sub").inner_text()

        yield disk_card


def gb_per_second(d: dict) -> str:
    """The restore rate a person reads: /health's bytes_restored over seconds_restoring."""
    n = d["bytes_restored"] / d["seconds_restoring"]
    return f"{n / 1e9:.2f} GB/s" if n >= 1e9 else f"{n / 1e6:.1f} MB/s"


@pytest.mark.needs_tool(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (apt-get install chromium)")
def test_the_dashboard_shows_no_restore_rate_before_any_restore(stack, dashboard):
    wait_for(lambda: (d := disk(stack.base_url)) and d["cap_bytes"] > 0, 60, "the disk tier to open")
    assert disk(stack.base_url)["restores"] == 0
    card = dashboard("restore rate –")
    assert re.search(r"0 restores, 0 failed · restore rate – · \d+ writes, \d+ evictions", card), card


def test_the_next_turn_after_restart_engine_restores_its_prefix_from_disk_and_answers_the_same(stack):
    wait_for(lambda: (d := disk(stack.base_url)) and d["cap_bytes"] > 0, 60, "the disk tier to open")
    one = chat(stack.base_url, KEY_A, FIRST)
    wait_for(lambda: disk(stack.base_url)["entries"] >= 1, 30, "turn one's entry on disk")
    stack.engine.stop()
    stack.engine = stack.start_engine()  # same PROMPT_CACHE_DIR: what `./launch.sh restart-engine` does
    wait_for(lambda: (d := disk(stack.base_url)) and d["cap_bytes"] > 0, 60, "the restarted engine's disk tier")
    turn = FIRST + [{"role": "assistant", "content": one["choices"][0]["message"]["content"]},
                    {"role": "user", "content": "And rule 8?"}]
    two = chat(stack.base_url, KEY_A, turn)
    assert two["usage"]["prompt_tokens_details"]["cached_tokens"] >= one["usage"]["prompt_tokens"] - 8
    # the same turn from another tenant: nothing of tenant A's is offered, so it is computed whole (the cache-off answer)
    other = chat(stack.base_url, KEY_B, turn)
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert two["choices"][0]["message"]["content"] == other["choices"][0]["message"]["content"]
    after = disk(stack.base_url)
    assert (after["restores"], after["restore_failures"]) == (1, 0) and after["hits"] == 1
    assert after["entries"] >= 1 and 0 < after["bytes"] <= after["cap_bytes"]
    metrics = httpx.get(stack.base_url + "/metrics", timeout=10).text
    assert "mcs_prompt_cache_disk_restores_total 1.0" in metrics
    assert "mcs_prompt_cache_disk_restore_failures_total 0.0" in metrics
    status = describe_info(msgspec.convert(stack.probe(), Info))  # what `./launch.sh status` prints
    assert f"disk cache {after['entries']} entries" in status and "1 restores, 0 restore failures" in status
    assert re.search(r"restore rate \d+\.\d+ [MG]B/s; \d+ writes, \d+ evictions", status), status


@pytest.mark.needs_tool(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (apt-get install chromium)")
def test_the_dashboard_shows_the_restore_rate_after_the_restore(stack, dashboard):
    d = disk(stack.base_url)
    assert d["restores"] == 1 and d["seconds_restoring"] > 0, f"the restore test above runs first: {d}"
    card = dashboard(f"restore rate {gb_per_second(d)}")
    assert f"1 restores, 0 failed · restore rate {gb_per_second(d)} · {d['writes']} writes" in card, card
