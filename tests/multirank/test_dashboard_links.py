"""/dashboard in headless Chromium on two ranks: the probed link between them, the models panel from
RUN_DIR/models.json and transfer.json (broken files included), and a frozen rank marked within 15 s."""

from __future__ import annotations

import json
import os
import signal
import time

import httpx
import pytest

from tests.harness import Stack, wait_for
from tests.integration.test_dashboard import CHROMIUM, CHROMIUM_ARGS

pytestmark = [pytest.mark.multirank,
              pytest.mark.needs_tool(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (apt-get install chromium)")]

MODELS = {"updated": time.time(), "served": "org/tiny-model", "hosts": [
    {"host": "mac-a", "ranks": [0], "cache": "/cache/a", "models": [
        {"repo": "org/tiny-model", "commit": "c0ffee", "revisions": ["c0ffee"], "size": 3_500_000,
         "total": 3_500_000, "complete": True, "manifest": True, "missing": []}]},
    {"host": "mac-b", "ranks": [1], "cache": "/cache/b", "models": [
        {"repo": "org/tiny-model", "commit": "c0ffee", "revisions": ["c0ffee"], "size": 1_000_000,
         "total": 3_500_000, "complete": False, "manifest": False, "missing": ["model.safetensors"]}]}],
    "generated": []}
TRANSFER = {"model": "org/tiny-model", "phase": "spread", "bytes_done": 1_000_000, "bytes_total": 3_500_000,
            "rate": 250_000_000.0, "file": "model.safetensors", "hosts": ["mac-b"], "started": time.time(),
            "updated": time.time(), "error": ""}


def test_dashboard_shows_the_link_the_models_a_transfer_and_a_frozen_rank(tmp_path):
    from playwright.sync_api import sync_playwright

    s = Stack()
    # a 5 s stall deadline (default 10) keeps a loaded machine within the 15 s bound: the marking is under test
    engine = s.start_engine(ranks=2, WATCHDOG_TIMEOUT="300", HEALTH_STALL_SECONDS="5")
    api = s.start_api(HEALTH_STALL_SECONDS="5")
    run_dir = s.root / "run"
    stopped = None
    try:
        wait_for(lambda: httpx.get(s.base_url + "/health", timeout=15).json().get("links"), 30, "the first probe")
        (run_dir / "models.json").write_text(json.dumps(MODELS))
        (run_dir / "transfer.json").write_text(json.dumps({**TRANSFER, "updated": time.time()}))
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": 1440, "height": 1200})
                page_errors: list[str] = []
                page.on("pageerror", lambda exc: page_errors.append(str(exc)))
                page.goto(s.base_url + "/dashboard")
                page.wait_for_selector("#status.pill-ok", timeout=15_000)
                row = page.locator('#links tr[data-pair="0-1"]')
                row.wait_for(timeout=10_000)
                cells = row.locator("td").all_inner_texts()
                assert cells[0] == "0 – 1" and cells[2].endswith(("µs", "ms")) and cells[3].endswith("B/s"), cells
                # the topology's wire between the ranks carries the same figures
                assert "B/s" in page.locator("#topology .link").nth(1).inner_text()

                served = httpx.get(s.base_url + "/health", timeout=15).json()["model"]
                assert page.locator("#models-served").inner_text() == f"served: {served}"
                tiny_b = page.locator('#models tr[data-host="mac-b"][data-repo="org/tiny-model"]')
                assert "incomplete (1 files missing)" in tiny_b.inner_text()
                assert "complete" in page.locator('#models tr[data-host="mac-a"]').inner_text()
                transfer = page.locator("#transfer")
                assert transfer.get_attribute("data-phase") == "spread"
                assert "spread org/tiny-model" in transfer.inner_text() and "mac-b" in transfer.inner_text()

                # a broken listing and a transfer whose writer died: notes, the page goes on polling
                (run_dir / "models.json").write_text("{ half written")
                (run_dir / "transfer.json").write_text(json.dumps({**TRANSFER, "updated": time.time() - 3600}))
                page.wait_for_function("() => document.getElementById('models-note').textContent"
                                       ".includes('not JSON')", timeout=10_000)
                assert "the transfer stopped" in transfer.inner_text()
                assert page.locator("#status.pill-ok").count() == 1

                rank1 = next(r for r in httpx.get(s.base_url + "/health", timeout=15).json()["rank_states"]
                             if r["rank"] == 1)
                os.kill(rank1["pid"], signal.SIGSTOP)
                stopped = time.monotonic()
                page.wait_for_selector("#topology .node.stale .silent", timeout=15_000)
                assert "NOT ANSWERING" in page.locator("#topology .silent").inner_text()
                # the status pill names it once the stall deadline (HEALTH_STALL_SECONDS) has passed
                page.wait_for_function(f"() => document.getElementById('status').textContent"
                                       f".includes('rank 1 ({rank1['host']}, pid {rank1['pid']})')",
                                       timeout=max(1, 15 - (time.monotonic() - stopped)) * 1000)
                assert time.monotonic() - stopped <= 15
                page.screenshot(path=str(tmp_path / "dashboard-links.png"), full_page=True)
                assert not page_errors, page_errors
            finally:
                browser.close()
    finally:
        if stopped is not None:
            os.kill(rank1["pid"], signal.SIGCONT)
        api.stop()
        engine.stop()
