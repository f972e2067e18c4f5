"""bench/agent_replay.py in a small version on demo-tiny: every turn reuses the turns before it, the answers
are the ones an engine without the cache gives, and the tables and the plot come out."""

from __future__ import annotations

import shutil

import pytest

from bench import agent_replay
from bench.servers import Workdir


def test_a_short_agent_replay_reuses_each_turn_and_answers_as_without_the_cache(tmp_path):
    opts = agent_replay.Options(model="demo-tiny", ranks=[1], turns=3, reps=2, sessions=3, system_tokens=2000,
                                quiet_wait=0)
    work = Workdir()
    try:
        res = agent_replay.measure(opts, work)
    finally:
        shutil.rmtree(work.root, ignore_errors=True)
    r = res["ranks"]["1"]
    replay = r["replay"]
    assert 1800 < replay[0]["prompt_tokens"] <= 2000
    assert all(x["same_output"] for x in replay) and r["turn2"]["same_output"]
    assert replay[0]["cached_tokens"] == 0
    for before, turn in zip(replay, replay[1:]):
        # all of the turn before, but the end of its answer, whose text may tokenise differently when sent back
        assert turn["cached_tokens"] >= before["prompt_tokens"]
        assert turn["cached_tokens_off"] == 0
    concurrent = r["concurrent"]
    assert concurrent["requests"] == 9
    # the engine's counters saw exactly what the responses reported
    assert (concurrent["received"], concurrent["cached"]) == (concurrent["usage_prompt_tokens"],
                                                              concurrent["usage_cached_tokens"])
    assert concurrent["ratio"] < agent_replay.COMPUTED_TARGET
    text = agent_replay.markdown(res)
    assert "| 1 | 3 |" in text and "3/3 turns identical" in text
    pytest.importorskip("matplotlib")
    from bench import agent_plot

    agent_plot.write(res, tmp_path / "replay.png")
    assert (tmp_path / "replay.png").stat().st_size > 10_000
