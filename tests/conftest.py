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


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """slow: skipped unless CI_SLOW=1. needs_tool(present, what): skip where the tool is missing; under CI=true, where .ci/run installs it, fail, so
    that a run without it cannot pass green."""
    if item.get_closest_marker("slow") is not None and os.environ.get("CI_SLOW") != "1":
        pytest.skip("a further case of a long matrix, of a kind CI already covers: CI_SLOW=1 runs it")
    for mark in item.iter_markers("needs_tool"):
        present, what = mark.args
        if present:
            continue
        if os.environ.get("CI") == "true":
            pytest.fail(f"{what} is missing and CI=true: .ci/run installs it (see its output), so this test must "
                        "run, not skip", pytrace=False)
        pytest.skip(f"{what} is missing (.ci/run installs it)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    folder = run_dir_made()
    if folder is not None and exitstatus == 0 and not os.environ.get("KEEP_TEST_DIRS"):
        shutil.rmtree(folder, ignore_errors=True)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    folder = run_dir_made()
    if folder is not None and folder.exists():
        terminalreporter.write_line(f"the test stacks' logs and settings are kept in {folder} (remove it when done)")
