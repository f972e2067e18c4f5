"""A real engine on the demo model and a real API on a free port, shared by the module's tests."""

from __future__ import annotations

import pytest

from tests.harness import Stack


@pytest.fixture(scope="session")
def stack():
    s = Stack()
    engine = s.start_engine()
    api = s.start_api()
    s.procs = {"engine": engine, "api": api}
    yield s
    api.stop()
    engine.stop()


@pytest.fixture(scope="session")
def client(stack):
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


@pytest.fixture
def own_stack():
    """An engine and an API of the test's own, for tests that kill or restart them."""
    s = Stack()
    s.procs = {"engine": s.start_engine(), "api": s.start_api()}
    s.closers = []
    yield s
    for c in s.closers:
        c.close()
    for p in s.procs.values():
        p.stop()


@pytest.fixture(scope="session")
def demo_tiny():
    """The demo-tiny model folder, generated here when no test has made it yet (whatever the order)."""
    from engine.demo import ensure_demo_model
    from tests.harness import MODEL_CACHE

    return ensure_demo_model("tiny", MODEL_CACHE)
