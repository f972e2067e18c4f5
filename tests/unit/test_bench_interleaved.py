"""bench/interleaved.py's summary: ratios paired round by round, and the tables a reader sees."""

from __future__ import annotations

import math

from bench.interleaved import BATCH_SIDES, SIDES, in_turn, paired, report


def test_ratios_pair_each_round_with_itself():
    # the machine halves its speed in round 2: paired ratios stay 0.9, medians of each side would not
    rounds = [{"ours (HTTP)": 90.0, "stream_generate": 100.0}, {"ours (HTTP)": 45.0, "stream_generate": 50.0},
              {"ours (HTTP)": 81.0, "stream_generate": 90.0}]
    assert math.isclose(paired(rounds, "ours (HTTP)", "stream_generate"), 0.9)


def test_a_round_missing_one_side_is_left_out_and_none_left_is_nan():
    rounds = [{"ours (HTTP)": 90.0, "stream_generate": 100.0}, {"ours (HTTP)": 10.0}]
    assert math.isclose(paired(rounds, "ours (HTTP)", "stream_generate"), 0.9)
    assert math.isnan(paired([{"ours (HTTP)": 1.0}], "ours (HTTP)", "mlx_lm.server"))


def test_report_shows_every_side_best_first_token_as_the_lowest():
    decode = [dict.fromkeys(SIDES, 50.0), {**dict.fromkeys(SIDES, 60.0), "mlx_lm.server": 40.0}]
    first = [dict.fromkeys(SIDES, 0.150), {**dict.fromkeys(SIDES, 0.120), "ours (HTTP)": 0.100}]
    text = report({"decode": decode, "first_token": first})
    for side in SIDES:
        assert f"| {side} |" in text
    assert "| ours (HTTP) | 100.0 ms |" in text  # fastest first token, in ms
    assert "| mlx_lm.server | 50.0 tok/s |" in text  # best decode rate
    assert "| first token: ours (HTTP) / mlx_lm.server | 0.917 |" in text  # median of 1.0 and 0.833


def test_concurrent_rounds_get_their_own_table_and_ratios_against_the_batch_ceiling_and_mlx_lm_server():
    one = [dict.fromkeys(SIDES, 50.0)]
    rounds = [{"BatchGenerator": 100.0, "ours (HTTP)": 95.0, "mlx_lm.server": 80.0},
              {"BatchGenerator": 50.0, "ours (HTTP)": 49.0, "mlx_lm.server": 35.0}]
    text = report({"decode": one, "first_token": one, "concurrent": {"8": rounds}})
    assert "| aggregate, 8 streams at once | best | median | per round |" in text
    assert "| BatchGenerator | 100.0 tok/s |" in text
    aggregate = text.split("| aggregate, 8 streams at once |")[1].split("\n\n")[0]
    assert "stream_generate" not in aggregate
    assert "| c=8: ours (HTTP) / in-process BatchGenerator(8) | 0.965 |" in text  # median of 0.95 and 0.98
    assert "| c=8: ours (HTTP) / mlx_lm.server | 1.294 |" in text  # median of 1.1875 and 1.4


def test_each_round_starts_with_the_next_side_and_results_keep_their_order():
    ran: list[str] = []
    calls = {name: (lambda name=name: ran.append(name) or name.upper()) for name in ["a", "b", "c"]}
    firsts = []
    for turn in range(4):
        ran.clear()
        assert list(in_turn(turn, calls).items()) == [("a", "A"), ("b", "B"), ("c", "C")]
        assert sorted(ran) == ["a", "b", "c"]  # every side once
        firsts.append(ran[0])
    assert firsts == ["a", "b", "c", "a"]


def test_the_engine_socket_gets_its_own_concurrent_ratio():
    one = [dict.fromkeys(SIDES, 50.0)]
    rounds = [dict.fromkeys(BATCH_SIDES, 100.0) | {"ours (engine socket)": 98.0}]
    text = report({"decode": one, "first_token": one, "concurrent": {"8": rounds}})
    assert "| c=8: ours (engine socket) / in-process BatchGenerator(8) | 0.980 |" in text
