"""/dashboard in headless Chromium: a chat message streams through its box and shows in the table."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM = "/usr/bin/chromium"
# Debian's Chromium, driven by Playwright (which must never download a browser of its own).
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.needs_tool(os.access(CHROMIUM, os.X_OK), f"{CHROMIUM} (apt-get install chromium)")

LAST_REPLY = "() => [...document.querySelectorAll('.msg.assistant, .msg.error')].pop()"


@contextmanager
def chromium_page() -> Iterator[tuple[object, list[str]]]:
    """(a page in headless Chromium, the errors its scripts raise), closed after."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page_errors: list[str] = []
            page.on("pageerror", lambda exc: page_errors.append(str(exc)))
            yield page, page_errors
        finally:
            browser.close()


def test_dashboard_chat_streams_and_the_request_appears(stack, tmp_path):
    with chromium_page() as (page, page_errors):
        page.goto(stack.base_url + "/dashboard")
        # the first poll of /dashboard/state has rendered a healthy engine and its rank
        page.wait_for_selector("#status.pill-ok", timeout=15_000)
        assert page.locator("#topology .node").count() >= 2  # the API and rank 0
        assert "KV fp32" in page.locator("#facts").inner_text()  # keys and values as the demo computes them
        # one rank has no links; no `./launch.sh models` has run in this stack's RUN_DIR
        assert page.locator("#links-empty").inner_text() == "One rank: no links."
        assert page.locator("#models-note").inner_text() == "run ./launch.sh models"

        page.fill("#chat-input", "hello from the dashboard")
        page.click("#chat-send")
        page.wait_for_function(f"() => ({LAST_REPLY})()?.dataset.state !== 'streaming'", timeout=30_000)
        reply = page.locator(".msg.assistant").last
        assert reply.get_attribute("data-state") == "done", page.locator(".msg").last.inner_text()
        assert reply.inner_text().strip()
        assert int(reply.get_attribute("data-chunks")) >= 2  # the text arrived in several SSE chunks

        request_id = reply.get_attribute("data-request-id")
        assert request_id and request_id.startswith("chatcmpl-")
        row = page.locator(f'#requests tr[data-id="{request_id}"]')
        row.wait_for(timeout=10_000)
        cells = row.locator("td").all_inner_texts()
        assert cells[2] == "/v1/chat/completions" and cells[-1] == "200", cells
        assert int(cells[4]) >= 2 and cells[5].endswith(("ms", " s")), cells  # completion tokens, TTFT
        # live tokens/s picked the generation up
        page.wait_for_function("() => Number(document.getElementById('tps').textContent) > 0", timeout=10_000)

        page.screenshot(path=str(tmp_path / "dashboard.png"), full_page=True)
        assert (tmp_path / "dashboard.png").stat().st_size > 10_000
        assert not page_errors, page_errors
