"""bench/report.py's targets from a hand-made run: ratios, the TTFT and idle goals, the `*` of a noisy side."""

from __future__ import annotations

import math

import pytest

from bench import report
from bench.run import wake_summary


def sweep(*cells: tuple[int, float, float]) -> list[dict]:
    return [{"concurrency": c, "aggregate_tps": tps, "aggregate_tps_median": tps, "other_load_cores": load,
             "errors": 0, "retries": 0, "ttft_p50_s": 0.1, "ttft_p90_s": 0.2, "server_cpu_ms_per_token": 1.0}
            for c, tps, load in cells]


def results(**servers) -> dict:
    meta = {"quiet_threshold": 0.5, "model": "demo-tiny", "started": "now", "host": "h", "machine": "x86_64", "cpus": 2,
            "mlx": "0", "mlx_lm": "0", "git": "abc", "max_tokens": 128, "eos_token_ids": [2],
            "prefill_tokens_per_step": 512, "quick": True, "idle_settle_s": 2.0}
    ceilings = {
        "stream_generate_1r": {"decode_tps": 100.0, "other_load_cores": 0.1, "runs": [{}]},
        "batchgen_1r": {"aggregate_tps": 400.0, "sequences": 8, "other_load_cores": 0.1, "runs": [{}]},
        "batchgen_2r": {"aggregate_tps": 200.0, "sequences": 8, "other_load_cores": 0.1, "runs": [{}]},
        "batchgen_plan_2r": {"aggregate_tps": 190.0, "sequences": 8, "other_load_cores": 0.0, "runs": [{}]},
        "stream_generate_2r": {"decode_tps": 50.0, "other_load_cores": 0.1, "runs": [{}]},
    }
    return {"meta": meta, "servers": servers, "ceilings": ceilings}


def test_each_target_compares_best_with_best_and_marks_a_noisy_side():
    res = results(
        ours_1r={"single": {"decode_tps_best": 96.0, "other_load_cores": 0.1},
                 "ttft": {"ttft_p50_s": 0.020, "ttft_p90_s": 0.03, "requests": 10, "other_load_cores": 0.1},
                 "sweep": sweep((8, 380.0, 0.1), (32, 560.0, 0.9))},
        mlxlm_1r={"ttft": {"ttft_p50_s": 0.025, "ttft_p90_s": 0.03, "requests": 10, "other_load_cores": 0.1},
                  "sweep": sweep((8, 300.0, 0.1), (32, 500.0, 0.1))},
        ours_2r={"single": {"decode_tps_best": 40.0, "other_load_cores": 0.1}, "sweep": sweep((8, 195.0, 0.1))},
        mlxlm_2r_pipe={"sweep": sweep((8, 190.0, 0.1))},
        ours_4r={"idle_cpu": {"rank 0": 1.0, "rank 1": 3.5, "api": 0.1, "mlx.launch": 0.0},
                 "wake": wake_summary([0.080, 0.090, 0.070], [0.030, 0.040, 0.035], 10.0, [], 0.1)},
    )
    t = report.targets(res)
    assert len(t) == 9
    rows = [(pytest.approx(x["value"]), x["pass"], x["noisy"]) for x in t]
    assert rows[0] == (0.96, True, False)  # single stream vs stream_generate
    assert rows[1] == (0.95, False, False)  # c=8 vs BatchGenerator(8): 0.97 needed
    assert rows[2] == (1.12, True, True)  # c=32 vs mlx_lm.server: ours ran while others used 0.9 cores
    assert rows[3] == (0.8, True, False)  # TTFT: ours / theirs <= 1
    assert rows[4] == (0.975, True, False)  # against the faster 2-rank ceiling (200, without plan broadcast)
    assert rows[5] == (195 / 190, True, False)
    assert rows[6] == (0.8, False, False)  # 2-rank single stream: 0.9 needed
    assert rows[7] == (3.5, False, False)  # the busiest process (rank 1) over 2 %
    assert rows[8] == (45.0, True, False)  # p50 80 ms after idle vs 35 ms warm: +45 ms <= 50 ms
    assert t[7]["target"].startswith("4 ranks idle: busiest process (rank 1)")
    assert [report.shown(x) for x in t[6:]] == ["0.800", "3.5 %", "+45 ms"]
    assert report.verdict(t[2]) == "PASS*" and report.verdict(t[1]) == "MISS"
    text = report.markdown(res)
    assert "### 8. First token after idle, ours, 4 ranks" in text
    assert "| ours, 4 ranks | rank 1 | 3.5 | one window | MISS |" in text


def test_unmeasured_targets_have_no_verdict_and_the_report_still_renders():
    res = results(ours_1r={"sweep": sweep((8, 380.0, 0.1))})
    t = report.targets(res)
    assert [x["pass"] for x in t] == [None, False, None, None, None, None, None, None, None]
    text = report.markdown(res)
    assert "### Targets" in text and "| 1 rank: aggregate tok/s at c=8 vs in-process BatchGenerator(8) |" in text


def test_the_wake_summary_compares_medians_and_bests_in_ms():
    w = wake_summary([0.5, 0.3], [0.2, 0.25, 0.1], 20.0, ["HTTP 503"], 0.2)
    assert math.isclose(w["diff_p50_ms"], 200.0) and math.isclose(w["diff_best_ms"], 200.0)
    assert w["error_count"] == 1 and w["gap_s"] == 20.0
    empty = wake_summary([], [], 10.0, [], 0.0)
    assert math.isnan(empty["diff_p50_ms"]) and math.isnan(empty["diff_best_ms"])
