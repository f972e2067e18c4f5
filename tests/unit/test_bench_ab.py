"""bench/ab.py's summary: this checkout over the other commit, paired round by round."""

from __future__ import annotations

import math

from bench.ab import report
from bench.interleaved import paired as ratios


def test_ratios_pair_each_round_and_skip_rounds_missing_a_side():
    rounds = [{"this": 110.0, "rev": 100.0}, {"this": 55.0, "rev": 50.0}, {"this": 1.0}]
    assert math.isclose(ratios(rounds, "this", "rev"), 1.1)
    assert math.isnan(ratios([{"this": 1.0}], "this", "rev"))


def test_report_names_the_other_commit_and_gives_both_ratios():
    rounds = [{"batch": {"this": 90.0, "rev": 100.0}, "single": {"this": 60.0, "rev": 50.0}},
              {"batch": {"this": 80.0, "rev": 100.0}, "single": {"this": 66.0, "rev": 60.0}}]
    text = report(rounds, "abc1234", 8)
    assert "| round | c=8 this | c=8 abc1234 | one stream this | one stream abc1234 |" in text
    assert "| 2 | 80.0 | 100.0 | 66.0 | 60.0 |" in text
    assert "| aggregate tok/s, 8 streams | 0.850 |" in text  # median of 0.9 and 0.8
    assert "| decode tok/s, one stream | 1.150 |" in text  # median of 1.2 and 1.1
