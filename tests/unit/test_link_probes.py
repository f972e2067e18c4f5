"""Rank 0's link probe schedule without MLX: probes go only into idle plans, at most every minute (the
first soon after start), never while a request runs, waits or is on its way in; sizes follow the last
measurement within their byte cap; the figures every rank gathered become Info's links."""

from __future__ import annotations

import queue

from engine.lockstep.link_pairs import encode, link_pairs, link_row
from engine.lockstep.results import StepResults
from engine.rank0.links import FIRST_AFTER, FIRST_BYTES, MAX_BYTES, MIN_BYTES, PROBE_EVERY, LinkProbes, busy
from tests.unit.test_scheduler import admit, make, plan, request

HOSTS = ["mac-a", "mac-b"]


def idle_plan(sched, links: LinkProbes, now: float, inbound: queue.SimpleQueue | None = None):
    """What rank 0's loop sends: the scheduler's plan, with a probe when one is due and nothing else waits."""
    inbound = inbound if inbound is not None else queue.SimpleQueue()
    return links.attach(plan(sched), now, busy(sched, inbound))


def test_an_idle_engine_probes_soon_after_start_then_at_most_once_a_minute() -> None:
    sched, _ = make()
    links = LinkProbes(2, "ring", HOSTS, start=100.0)
    assert idle_plan(sched, links, 100.0).probe == 0  # the engine just started: not yet
    first = idle_plan(sched, links, 100.0 + FIRST_AFTER)
    assert first.idle and first.probe == FIRST_BYTES  # nothing measured yet
    for now in (100.0 + FIRST_AFTER + 1, 100.0 + FIRST_AFTER + PROBE_EVERY - 0.1):
        assert idle_plan(sched, links, now).probe == 0
    assert idle_plan(sched, links, 100.0 + FIRST_AFTER + PROBE_EVERY).probe > 0


def test_no_probe_while_a_request_runs_or_waits_and_the_next_idle_plan_carries_it() -> None:
    sched, _ = make(max_batch=1)
    links = LinkProbes(2, "ring", HOSTS, start=0.0)
    admit(sched, request("a"), request("b"))  # b waits for a's slot
    now = FIRST_AFTER + 5
    assert busy(sched, queue.SimpleQueue()) and not links.due(now, busy(sched, queue.SimpleQueue()))
    working = idle_plan(sched, links, now)
    assert [i.rid for i in working.inserts] == ["a"] and working.probe == 0
    sched.absorb(StepResults(tokens=[("a", 0, "stop")]))  # a ends; b still waits for its turn
    assert idle_plan(sched, links, now).probe == 0
    sched.absorb(StepResults(tokens=[("b", 0, "stop")]))
    while sched.has_work():
        assert idle_plan(sched, links, now).probe == 0
    assert idle_plan(sched, links, now).probe == FIRST_BYTES  # idle at last: the probe that was due goes now


def test_a_request_on_its_way_in_holds_the_probe_back() -> None:
    sched, counters = make()
    links = LinkProbes(2, "ring", HOSTS, start=0.0)
    now = FIRST_AFTER + 1
    inbound: queue.SimpleQueue = queue.SimpleQueue()
    inbound.put("a submission the loop has not taken yet")
    assert idle_plan(sched, links, now, inbound).probe == 0
    inbound.get()
    assert counters.admit(1, capacity=8)  # admitted by the socket thread, not yet submitted
    assert idle_plan(sched, links, now, inbound).probe == 0
    counters.unadmit(1)
    assert idle_plan(sched, links, now, inbound).probe == FIRST_BYTES


def test_a_shutdown_plan_or_a_single_rank_never_probes() -> None:
    sched, _ = make()
    links = LinkProbes(2, "ring", HOSTS, start=0.0)
    stop = sched.next_plan(0, 0, idle=True, shutdown=True)
    assert links.attach(stop, FIRST_AFTER + 1, False).probe == 0
    alone = LinkProbes(1, "ring", ["mac-a"], start=0.0)
    assert alone.pairs == [] and idle_plan(sched, alone, 1e6).probe == 0


def test_ring_probes_neighbours_and_jaccl_every_pair() -> None:
    assert link_pairs(2, "ring") == [(0, 1)]
    assert link_pairs(4, "ring") == [(0, 1), (0, 3), (1, 2), (2, 3)]
    assert link_pairs(3, "jaccl") == [(0, 1), (0, 2), (1, 2)]
    assert link_pairs(1, "jaccl") == []


def test_figures_become_links_and_the_next_probe_is_sized_from_the_slowest() -> None:
    links = LinkProbes(3, "ring", ["a", "b", "c"], start=0.0)
    assert links.pairs == [(0, 1), (0, 2), (1, 2)]
    # the lower rank of each pair measured it: rank 0 pairs 0 and 1, rank 1 pair 2
    rows = [link_row(links.pairs, {0: encode(40e-6, 2e9, 0.003), 1: encode(50e-6, 1e9, 0.004)}),
            link_row(links.pairs, {2: encode(1e-3, 100e6, 0.02)}),
            link_row(links.pairs, {})]
    links.record(rows, MIN_BYTES, now=10.0)
    got = links.snapshot(now=12.5)
    assert [(link.a, link.b, link.host_a, link.host_b) for link in got] == [(0, 1, "a", "b"), (0, 2, "a", "c"),
                                                                            (1, 2, "b", "c")]
    assert abs(got[0].latency_seconds - 40e-6) < 1e-9 and abs(got[2].latency_seconds - 1e-3) < 1e-9
    assert abs(got[2].bandwidth_bytes_per_second - 100e6) < 2048 and got[0].probe_bytes == MIN_BYTES
    assert all(link.age == 2.5 for link in got) and abs(got[2].probe_seconds - 0.02) < 1e-6
    # 100 MB/s is the slowest: a probe of about 20 ms of it
    assert 1.9e6 < links.probe_bytes() < 2.1e6 and FIRST_BYTES != links.probe_bytes()
    links.record([link_row(links.pairs, {0: encode(1e-5, 1e6, 0.1), 1: encode(1e-5, 1e6, 0.1)}),
                  link_row(links.pairs, {}), link_row(links.pairs, {})], MIN_BYTES, now=20.0)
    assert links.probe_bytes() == MIN_BYTES  # a slow (or unmeasured) link: never below the floor...
    fast = LinkProbes(2, "jaccl", HOSTS, start=0.0)
    fast.record([link_row(fast.pairs, {0: encode(5e-6, 6e9, 0.001)}), link_row(fast.pairs, {})], MIN_BYTES)
    assert fast.probe_bytes() == MAX_BYTES  # ...and a fast one never above the cap
