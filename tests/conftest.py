"""Shared pytest fixtures: async tests run on asyncio through anyio's pytest plugin. A run that passes
leaves nothing under /tmp; one that fails keeps its stacks' folders (logs, settings) and says where."""

import os
import shutil

import pytest

from tests.harness import run_dir_made

# The default MODEL is a real 135M model, many times slower per token here than the random-weight demo: whatever a
# test starts without naming MODEL (stacks, launch.sh, engines) serves demo-tiny; the real model's tests name it.
os.environ["MODEL"] = "demo-tiny"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = run_dir_made()
    if folder is not None and exitstatus == 0 and not os.environ.get("KEEP_TEST_DIRS"):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    folder = run_dir_made()
    if folder is not None and folder.exists():
        terminalreporter.write_line(f"the test stacks' logs and settings are kept in {folder} (remove it when done)")
