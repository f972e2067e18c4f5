"""A small version of bench/soak.py on the session's engine: a burst of mixed requests with a
fifth of the clients leaving early ends with no undocumented status and zero active sequences."""

from __future__ import annotations

import argparse

import anyio

from bench.soak import soak, table


def test_a_small_soak_with_early_disconnects_leaks_nothing(stack):
    result = anyio.run(soak, stack.base_url, 150, 16, 0.2, 1)
    text, ok = table(result, argparse.Namespace(concurrency=16, disconnect=0.2))
    assert ok, text
    assert not result.failures(), text
    assert result.statuses()["left early"] > 10, text
    assert result.end_info["active"] == 0 and result.end_info["queued"] == 0, text
