"""The supervisor's verdict: which rank failed, from the ranks rank 0 announced and the lines it relays.

The real thing (two ranks, one killed or frozen) is tests/multirank/test_rank_faults.py.
"""

from __future__ import annotations

import pytest

from config import load_settings
from ipc.messages import RankState
from ops.failures import Observed, describe_exit
from ops.supervisor import Supervisor

# What rank 0's Info.rank_states announces about a two-rank engine.
JOINED = [RankState(rank=0, host="mac-1", pid=798), RankState(rank=1, host="mac-2", pid=799)]
WATCHDOG = ("2026-11-22 13:52:32,544 rank0 CRITICAL engine.watchdog: rank 0: no progress for 5.6 s while "
            "broadcasting plan 10 (WATCHDOG_TIMEOUT=5 s): a peer rank is dead or frozen; ending this rank")


def supervisor(tmp_path, lines: list) -> Supervisor:
    settings = load_settings({"RUN_DIR": str(tmp_path)}, "/nonexistent/.env")
    sup = Supervisor(settings, ["/venv/bin/mlx.launch", "--", "python", "-m", "engine"])
    sup.observed.announce([x for x in lines if isinstance(x, RankState)], 2 if JOINED[0] in lines else 0)
    for line in lines:
        if isinstance(line, str):
            sup.observed.read(line)
    return sup


def test_announced_ranks_give_each_rank_its_pid_and_host():
    obs = Observed()
    obs.announce(JOINED, 2)
    assert obs.size == 2
    assert (obs.ranks[0].pid, obs.ranks[0].host) == (798, "mac-1")
    assert (obs.ranks[1].pid, obs.ranks[1].host) == (799, "mac-2")


def test_a_killed_rank_is_blamed_not_the_rank_that_lost_it(tmp_path):
    sup = supervisor(tmp_path, [*JOINED, "\x1b[33m[WARN] Node with rank 1 exited with code -9 \x1b[0m",
                                "2026-11-22 rank0 CRITICAL engine: rank 0: [ring] connection to a peer was lost",
                                "\x1b[33m[WARN] Node with rank 0 exited with code 4 \x1b[0m"])
    failure = sup.blame(sup._exits(), "")
    assert failure.rank == 1
    assert failure.summary == "rank 1 (pid 799 on mac-2) was killed by SIGKILL"


def test_a_frozen_rank_is_the_one_still_running_when_a_watchdog_fires(tmp_path):
    sup = supervisor(tmp_path, [*JOINED, WATCHDOG, "[WARN] Node with rank 0 exited with code 70"])
    failure = sup.blame(sup._exits(), "")
    assert failure.rank == 1
    assert failure.summary.startswith("rank 1 (pid 799 on mac-2) stopped responding")
    assert "rank 0 was ended by its watchdog" in failure.summary
    assert "no progress for 5.6 s" in failure.detail


def test_rank_0_that_stops_answering_is_named(tmp_path):
    sup = supervisor(tmp_path, JOINED)
    failure = sup.blame([], "stopped answering on /run/engine.sock for 7 s")
    assert failure.rank == 0 and "stopped answering" in failure.summary


@pytest.mark.parametrize(("code", "words"), [(-9, "killed by SIGKILL"), (-19, "killed by SIGSTOP"),
                                              (70, "watchdog"), (4, "lost its connection"), (1, "exited with code 1"),
                                              (None, "killed by mlx.launch")])
def test_exit_codes_in_words(code, words):
    assert words in describe_exit(code)


def test_state_file_is_written_atomically(tmp_path):
    import json

    sup = supervisor(tmp_path, [])
    sup.write_state("restarting", next_restart_at=12.0)
    state = json.loads((tmp_path / "engine.state.json").read_text())
    assert state["state"] == "restarting" and state["next_restart_at"] == 12.0
    sup.write_state("running")
    assert json.loads((tmp_path / "engine.state.json").read_text())["next_restart_at"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["engine.state.json"]


def jaccl_settings(tmp_path, **more: str):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text("[]")
    return load_settings({"RUN_DIR": str(tmp_path), "BACKEND": "jaccl", "HOSTFILE": str(hostfile), **more},
                         "/nonexistent/.env")


def test_ebusy_from_jaccl_is_explained_in_status_in_one_sentence(tmp_path):
    from ops.layout import Layout
    from ops.state import EngineState, LastFailure, state_path, write_state
    from ops.status import describe_failures

    sup = Supervisor(jaccl_settings(tmp_path, JACCL_COOLDOWN="30"), ["/venv/bin/mlx.launch", "--", "python"])
    for line in ["ValueError: [jaccl] Changing queue pair to RTR failed with errno 16 on rdma_en3 towards peer "
                 "169.254.12.2", "[WARN] Node with rank 1 exited with code 1"]:
        sup.observed.read(line)
    failure = sup.blame(sup._exits(), "")
    assert failure.rank == 1 and failure.hint.count(". ") == 0
    for words in ("EBUSY", "wait", "JACCL_COOLDOWN (now 30 s)", "reboot"):
        assert words in failure.hint
    # what `launch.sh status` prints from the supervisor's record
    write_state(state_path(tmp_path), EngineState(pid=5, state="failed", last_failure=LastFailure(
        time=1.0, summary=failure.summary, rank=1, detail=failure.detail, hint=failure.hint)))
    assert f"what it means: {failure.hint}" in describe_failures(Layout(sup.settings), 5)


def test_a_rank_failure_without_ebusy_gets_no_jaccl_hint(tmp_path):
    sup = Supervisor(jaccl_settings(tmp_path), ["/venv/bin/mlx.launch", "--", "python"])
    sup.observed.read("ValueError: [jaccl] Changing queue pair to RTR failed with errno 22")
    sup.observed.read("[WARN] Node with rank 1 exited with code 1")
    assert sup.blame(sup._exits(), "").hint == ""


def test_a_jaccl_start_waits_jaccl_cooldown_after_the_last_stop(tmp_path, monkeypatch):
    import time

    from ops import engine_ctl
    from ops.layout import Layout

    ctl = engine_ctl.EngineCtl(Layout(jaccl_settings(tmp_path, JACCL_COOLDOWN="45")))
    ctl.stopped_at.write_text(f"{int(time.time()) - 5}\n")
    waits: list[float] = []
    monkeypatch.setattr(engine_ctl.time, "sleep", waits.append)
    ctl.cooldown()
    assert len(waits) == 1 and 38 <= waits[0] <= 40
