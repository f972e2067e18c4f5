"""Regenerate docs/dashboard.png: the default real model on local ranks, some traffic, one chat message, a screenshot.

    .venv/bin/python docs/screenshot.py        (needs /usr/bin/chromium; a few minutes on a 2-core CPU)
"""

from __future__ import annotations

import concurrent.futures as cf
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.harness import Stack  # noqa: E402
from tests.integration.test_dashboard import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

PROMPTS = ["What is the capital of Italy?", "Name three planets.", "Write a haiku about the sea.",
           "What is 12 times 12?", "Say hello in French.", "What colour is the sky?"]
# one rank: on a 2-core host 2 pipelined or 3 tensor ranks busy-wait for each other, seconds a token
RANKS = 1


def main() -> int:
    import openai
    from playwright.sync_api import sync_playwright

    stack = Stack(extra={"MODEL": "smollm2-135m"})
    engine = stack.start_engine(ranks=RANKS)
    api = stack.start_api()
    client = openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        def ask(i: int) -> None:
            client.chat.completions.create(model="default", max_tokens=16 + 8 * (i % 4), temperature=0.2,
                                           messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 980})
            page.goto(stack.base_url + "/dashboard")
            page.wait_for_selector("#status.pill-ok", timeout=15_000)
            with cf.ThreadPoolExecutor(4) as pool:
                for burst in range(2):
                    list(pool.map(ask, range(burst * 4, burst * 4 + 4)))
                    time.sleep(1.0)
            try:
                client.chat.completions.create(model="default", max_tokens=5, temperature=7,
                                               messages=[{"role": "user", "content": "x"}])
            except openai.BadRequestError:
                pass  # shows under recent errors
            page.fill("#chat-input", "What is the capital of France?")
            page.click("#chat-send")
            page.wait_for_function("() => [...document.querySelectorAll('.msg.assistant')].pop()"
                                   "?.dataset.state === 'done'", timeout=180_000)
            time.sleep(1.5)
            page.screenshot(path=str(REPO / "docs" / "dashboard.png"))
            browser.close()
    finally:
        client.close()
        api.stop()
        engine.stop()
    print(REPO / "docs" / "dashboard.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
