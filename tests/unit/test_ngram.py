"""Prompt lookup (SPECULATIVE=ngram): what it proposes, and that it stays right as histories grow."""

from __future__ import annotations

import random
import time

import pytest

from engine.speculative.ngram import NgramProposer


def naive(history: list[int], k: int, max_n: int = 4, min_n: int = 2) -> list[int]:
    """The definition, by a backwards scan: the longest suffix (max_n..min_n) seen earlier, its most recent
    earlier occurrence, and the k tokens after it (continuing with its own proposals past the end)."""
    size = len(history)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = history[size - n:]
        for end in range(size - 1, n - 1, -1):
            if history[end - n:end] == suffix:
                out = []
                for j in range(k):
                    i = end + j
                    out.append(history[i] if i < size else out[i - size])
                return out
    return []


def test_copies_what_followed_the_earlier_occurrence():
    p = NgramProposer()
    # "def f ( x ) :" appeared, the answer now writes "f ( x": propose ") :" and on
    history = [7, 1, 2, 3, 4, 5, 6, 9, 9, 1, 2, 3]
    assert p.propose({"a": history}, 3) == {"a": [4, 5, 6]}


def test_longest_match_wins_over_a_more_recent_shorter_one():
    p = NgramProposer()
    history = [1, 2, 3, 50, 51, 9, 2, 3, 60, 61, 1, 2, 3]
    # "2 3" last occurred before 60, but "1 2 3" occurred before 50
    assert p.propose({"a": history}, 2) == {"a": [50, 51]}


def test_most_recent_of_equal_matches():
    p = NgramProposer()
    history = [1, 2, 10, 1, 2, 20, 1, 2]
    assert p.propose({"a": history}, 1) == {"a": [20]}


def test_no_match_proposes_nothing():
    p = NgramProposer()
    assert p.propose({"a": [1, 2, 3, 4, 5, 6]}, 4) == {}
    assert p.propose({"b": [5]}, 4) == {}
    assert p.propose({"c": []}, 4) == {}


def test_a_short_period_is_proposed_whole():
    p = NgramProposer()
    # the latest "1 2 3" before the end overlaps it: the continuation runs on with its own proposals
    assert p.propose({"a": [1, 2, 3, 1, 2, 3]}, 5) == {"a": [1, 2, 3, 1, 2]}
    assert p.propose({"b": [4, 4, 4]}, 3) == {"b": [4, 4, 4]}


def test_k_caps_the_proposal():
    p = NgramProposer()
    assert p.propose({"a": [1, 2, 3, 4, 5, 6, 1, 2]}, 2) == {"a": [3, 4]}
    assert p.propose({"a": [1, 2, 3, 4, 5, 6, 1, 2]}, 0) == {}


@pytest.mark.parametrize("seed", range(5))
def test_growing_histories_match_a_fresh_scan(seed):
    """Rank 0 asks every step with histories a token or several (accepted drafts) longer: the kept index
    answers exactly what a scan of the whole history answers, several sequences at once."""
    rng = random.Random(seed)
    p = NgramProposer()
    histories = {rid: [rng.randrange(6) for _ in range(rng.randrange(1, 30))] for rid in "abc"}
    for _ in range(60):
        for h in histories.values():
            h.extend(rng.randrange(6) for _ in range(rng.randrange(1, 4)))
        got = p.propose({rid: list(h) for rid, h in histories.items()}, 4)
        want = {rid: d for rid, h in histories.items() if (d := naive(h, 4))}
        assert got == want


def test_a_reused_id_starts_afresh():
    p = NgramProposer()
    assert p.propose({"a": [1, 2, 9, 1, 2]}, 1) == {"a": [9]}
    # the same id, another sequence (the old one left without forget): not answered from the old index
    assert p.propose({"a": [5, 6, 7, 5, 6, 1, 2]}, 1) == {}
    p.forget("a")
    assert p.indexes == {}
    assert p.propose({"a": [3, 4, 8, 3, 4]}, 1) == {"a": [8]}


def test_deterministic():
    h = [random.Random(1).randrange(50) for _ in range(2000)]
    assert NgramProposer().propose({"x": h}, 4) == NgramProposer().propose({"x": h}, 4)


def test_long_history_costs_little_per_step():
    """A 32k-token prompt is indexed once; each step then reads only the tokens gained (rank 0 runs it for
    every sequence before every plan)."""
    rng = random.Random(0)
    history = [rng.randrange(32000) for _ in range(32768)]
    p = NgramProposer()
    t0 = time.perf_counter()
    p.propose({"a": history}, 4)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i in range(200):
        history.append(rng.randrange(32000))
        p.propose({"a": history}, 4)
    per_step = (time.perf_counter() - t0) / 200
    assert first < 2.0, first
    assert per_step < 0.005, per_step
