"""The doorbell that wakes idle ranks: real TCP sockets on loopback, the plan channel's gather faked with threads."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.lockstep.doorbell import REPORT, RING, Bell, Doorbell, DoorbellError, open_doorbell, rank0_host


class FakeGather:
    """gather() across threads standing in for ranks: every rank's row, to every rank."""

    def __init__(self, size: int):
        self.rows: list[list[int]] = [[] for _ in range(size)]
        self.barrier = threading.Barrier(size, timeout=10)

    def of(self, rank: int):
        def gather(row: list[int]) -> list[list[int]]:
            self.rows[rank] = list(row)
            self.barrier.wait()
            table = [list(r) for r in self.rows]
            self.barrier.wait()
            return table
        return gather


def open_all(size: int, timeout: float = 10.0) -> list[Doorbell | Bell]:
    fake = FakeGather(size)
    with ThreadPoolExecutor(size) as pool:
        futures = [pool.submit(open_doorbell, r, size, fake.of(r), "127.0.0.1", timeout) for r in range(size)]
        return [f.result(timeout=20) for f in futures]


@pytest.fixture
def four():
    ends = open_all(4)
    yield ends
    for end in ends:
        end.close()


def test_every_rank_gets_one_connection_to_rank_0(four):
    bell0, *bells = four
    assert isinstance(bell0, Doorbell) and sorted(bell0.peers) == [1, 2, 3]
    assert [type(b) for b in bells] == [Bell] * 3 and [b.rank for b in bells] == [1, 2, 3]


def test_a_ring_wakes_every_sleeping_rank_exactly_once(four):
    bell0, *bells = four
    with ThreadPoolExecutor(3) as pool:
        sleepers = [pool.submit(b.wait, 10.0) for b in bells]
        bell0.ring()
        assert [s.result(timeout=10) for s in sleepers] == [RING] * 3
    # one ring is one wake-up: the next wait sleeps again
    assert [b.wait(0.05) for b in bells] == [None] * 3


def test_a_ring_before_the_rank_sleeps_is_not_lost(four):
    bell0, *bells = four
    bell0.ring()
    bell0.ring()
    assert [b.wait(5.0) for b in bells] == [RING] * 3
    assert [b.wait(5.0) for b in bells] == [RING] * 3
    assert [b.wait(0.05) for b in bells] == [None] * 3
    assert bell0.rings == 2


def test_sleeping_ranks_answer_reports_in_rank_order_and_sleep_on(four):
    bell0, *bells = four

    def sleeper(b: Bell) -> list[bytes]:
        seen = []
        while True:
            kind = b.wait(10.0)
            seen.append(kind)
            if kind == RING:
                return seen
            b.answer([b.rank, 1 << 40, -5])

    with ThreadPoolExecutor(3) as pool:
        sleepers = [pool.submit(sleeper, b) for b in bells]
        assert bell0.gather([0, 7, 7]) == [[0, 7, 7], [1, 1 << 40, -5], [2, 1 << 40, -5], [3, 1 << 40, -5]]
        assert bell0.gather([0, 8, 8])[1:] == [[r, 1 << 40, -5] for r in (1, 2, 3)]
        bell0.ring()
        assert [s.result(timeout=10) for s in sleepers] == [[REPORT, REPORT, RING]] * 3


def test_rank_0_knows_which_rank_has_not_answered_its_report_while_it_waits(four):
    """A frozen rank holds rank 0's report request; the others' answers arrive, and only the silent rank (rank 1,
    the first one asked) is named, with how long rank 0 has waited, until it answers."""
    bell0, bell1, *others = four
    assert bell0.unanswered() == {}
    with ThreadPoolExecutor(3) as pool:
        for b in others:
            pool.submit(lambda b=b: (b.wait(10.0), b.answer([b.rank])))
        gathered = pool.submit(bell0.gather, [0])
        wait = lambda: bell0.unanswered() if list(bell0.unanswered()) == [1] else None  # noqa: E731
        late = None
        for _ in range(200):
            late = wait()
            if late:
                break
            threading.Event().wait(0.01)
        assert late is not None and late[1] >= 0, bell0.unanswered()
        assert not gathered.done()
        assert bell1.wait(10.0) == REPORT
        bell1.answer([1])
        assert gathered.result(timeout=10) == [[0], [1], [2], [3]]
    assert bell0.unanswered() == {}


def test_a_rank_that_died_asleep_is_noticed_at_the_next_report(four):
    bell0, bell1, *_ = four
    bell1.close()
    with pytest.raises(DoorbellError, match="rank 1"):
        bell0.gather([0])


def test_rank_0_gone_ends_a_sleeping_rank_instead_of_leaving_it_asleep(four):
    bell0, *bells = four
    bell0.close()
    for b in bells:
        with pytest.raises(DoorbellError, match="rank 0 closed the doorbell connection"):
            b.wait(5.0)


def test_a_lost_rank_makes_rank_0_fail_instead_of_waiting_for_it(four):
    bell0, bell1, *_ = four
    bell1.close()
    with pytest.raises(DoorbellError, match="rank 1's doorbell connection is gone"):
        for _ in range(100):  # the first bytes may still be accepted by the kernel before the reset arrives
            bell0.ring()


def test_strangers_cannot_take_a_rank_s_place():
    """Connections without the token (a port scanner, a stale rank of an earlier run) are dropped."""
    fake = FakeGather(2)
    port = {}

    def follower():
        table = fake.of(1)([0, 0, 0])
        port["p"] = table[0][0]
        for junk in (b"", b"GET / HTTP/1.0\r\n\r\n", bytes(12)):
            with socket.create_connection(("127.0.0.1", table[0][0]), timeout=5) as s:
                s.sendall(junk)
        from engine.lockstep import doorbell as d
        return Bell(d._connect("127.0.0.1", table[0][0], (table[0][1] << 31) | table[0][2], 1, 5.0), 1)

    with ThreadPoolExecutor(2) as pool:
        lead = pool.submit(open_doorbell, 0, 2, fake.of(0), "127.0.0.1", 10.0)
        bell1 = pool.submit(follower).result(timeout=20)
        bell0 = lead.result(timeout=20)
    try:
        assert sorted(bell0.peers) == [1]
        bell0.ring()
        assert bell1.wait(5.0) == RING
    finally:
        bell0.close()
        bell1.close()


def test_a_rank_that_never_connects_is_named_when_rank_0_gives_up():
    fake = FakeGather(3)
    with ThreadPoolExecutor(3) as pool:
        lead = pool.submit(open_doorbell, 0, 3, fake.of(0), "127.0.0.1", 1.0)
        bell1 = pool.submit(open_doorbell, 1, 3, fake.of(1), "127.0.0.1", 1.0)
        fake.of(2)([0, 0, 0])  # rank 2 joins the gather but never connects
        with pytest.raises(DoorbellError, match=r"ranks \[2\] did not connect"):
            lead.result(timeout=20)
        bell1.result(timeout=20).close()


def test_rank_0_s_address_comes_from_what_mlx_launch_set(tmp_path):
    hostfile = tmp_path / "hosts.json"
    hostfile.write_text(json.dumps([["10.0.0.5:5000", "10.0.0.5:5001"], ["10.0.0.6:5002"]]))
    assert rank0_host({"MLX_HOSTFILE": str(hostfile)}) == "10.0.0.5"
    assert rank0_host({"MLX_JACCL_COORDINATOR": "192.168.2.1:32323"}) == "192.168.2.1"
    assert rank0_host({"MLX_HOSTFILE": str(tmp_path / "missing.json")}) == "127.0.0.1"
    assert rank0_host({}) == "127.0.0.1"


def test_the_engine_s_doorbell_listens_just_below_ring_port_so_one_firewall_rule_covers_it():
    from config import load_settings
    from ops.procs import free_ring_port

    ring = free_ring_port(2)
    settings = load_settings({"RING_PORT": str(ring), "HOSTS": "127.0.0.1,127.0.0.1"}, "/nonexistent/.env")
    assert settings.doorbell_port == ring - 1
    fake = FakeGather(2)
    with ThreadPoolExecutor(2) as pool:
        ends = [pool.submit(open_doorbell, r, 2, fake.of(r), "127.0.0.1", 10.0, port=settings.doorbell_port)
                for r in range(2)]
        lead, bell = (f.result(timeout=20) for f in ends)
    try:
        assert bell.sock.getpeername()[1] == ring - 1  # rank 1 rang the door at RING_PORT-1
    finally:
        lead.close()
        bell.close()


def test_a_doorbell_port_in_use_ends_every_rank_with_the_port_and_the_fix():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        fake = FakeGather(2)
        with ThreadPoolExecutor(2) as pool:
            ends = [pool.submit(open_doorbell, r, 2, fake.of(r), "127.0.0.1", 10.0, port=port) for r in range(2)]
            with pytest.raises(DoorbellError, match=f"rank 0 cannot listen for the doorbell on port {port} .*RING_PORT"):
                ends[0].result(timeout=20)
            with pytest.raises(DoorbellError, match=f"rank 1: rank 0 could not open its doorbell on port {port}"):
                ends[1].result(timeout=20)
