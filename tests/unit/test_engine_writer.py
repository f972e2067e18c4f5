"""Rank 0's writer thread: the step thread's post() only queues; the writer thread writes every step's events to
each client in order, sends what piled up meanwhile in one write per client, hands what it cannot write to
the event loop, and stop() delivers the last steps first. Real sockets; no model."""

from __future__ import annotations

import logging
import socket
import threading

import anyio
import pytest

from engine.rank0.outbox import ABANDONED, DONE, Outbox
from engine.rank0.writer import Writer, WriterFailed
from ipc import Delta, Error, Finish
from tests.wire import frames

WAIT = 10.0  # bound on every wait for the writer thread


def delta(i: int, rid: str = "r") -> Delta:
    return Delta(request_id=rid, text=f"token {i} ", completion_tokens=i + 1)


def finish(rid: str = "r") -> Finish:
    return Finish(request_id=rid, finish_reason="length", prompt_tokens=3, completion_tokens=1)


class Recording:
    """A client socket as the Outbox sees it: records which thread wrote what; can hold a write until released."""

    def __init__(self, sock: socket.socket, hold_first: bool = False):
        self.sock = sock
        self.writes: list[tuple[str, bytes]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        if not hold_first:
            self.release.set()

    def send(self, data: bytes) -> int:
        self.entered.set()
        assert self.release.wait(WAIT)
        self.writes.append((threading.current_thread().name, bytes(data)))
        return self.sock.send(data)


class Loop:
    """The event loop's side: what the writer hands off."""

    def __init__(self):
        self.items: list = []
        self.lock = threading.Lock()

    def __call__(self, queued: list) -> None:
        with self.lock:
            self.items.extend(item for _, item in queued)


@pytest.fixture
def loop():
    return Loop()


@pytest.fixture
def writer(loop):
    w = Writer(loop)
    w.start()
    yield w
    w.stop()


@pytest.fixture
def pair():
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    for sock, option in ((ours, socket.SO_SNDBUF), (peer, socket.SO_RCVBUF)):
        sock.setsockopt(socket.SOL_SOCKET, option, 1 << 18)  # every test's frames fit (macOS's default is 8 KB)
    ours.setblocking(False)
    peer.settimeout(WAIT)
    yield ours, peer
    ours.close()
    peer.close()


def client(sock, hold_first: bool = False) -> tuple[Outbox, Recording, object]:
    send, receive = anyio.create_memory_object_stream(16)
    box = Outbox(send, 1 << 20)
    rec = Recording(sock, hold_first)
    box.open(rec, 1)
    return box, rec, receive


def read_frames(peer: socket.socket, count: int) -> list:
    got, data = [], b""
    while len(got) < count:
        chunk = peer.recv(1 << 16)
        assert chunk, "the writer closed the socket"
        data += chunk
        try:
            got = frames(data)
        except Exception:  # a frame cut in two: read on
            continue
    return got


def test_every_step_reaches_its_client_in_order_written_by_the_writer_thread(writer, loop, pair):
    ours, peer = pair
    box, rec, receive = client(ours)
    for i in range(200):
        writer.post([(box, delta(i))])
    writer.post([(box, finish())])
    got = read_frames(peer, 201)
    assert [m.completion_tokens for m in got[:200]] == list(range(1, 201))
    assert isinstance(got[200], Finish)
    assert {name for name, _ in rec.writes} == {"engine-writer"}  # never the step thread's own write
    writer.stop()
    assert loop.items == [DONE]  # the request's end goes to its relay; nothing else needed the event loop
    receive.close()
    box.stream.close()


def test_steps_that_pile_up_while_the_writer_writes_go_out_in_one_write(writer, pair):
    ours, peer = pair
    box, rec, receive = client(ours, hold_first=True)
    writer.post([(box, delta(0))])
    assert rec.entered.wait(WAIT)  # the writer is inside its first write, held there
    for i in range(1, 6):
        writer.post([(box, delta(i))])
    rec.release.set()
    got = read_frames(peer, 6)
    assert [m.completion_tokens for m in got] == [1, 2, 3, 4, 5, 6]
    assert len(rec.writes) == 2 and len(frames(rec.writes[1][1])) == 5
    receive.close()
    box.stream.close()


def test_stop_delivers_the_last_steps_first(writer, loop, pair):
    ours, peer = pair
    box, rec, receive = client(ours, hold_first=True)
    writer.post([(box, delta(0))])
    assert rec.entered.wait(WAIT)
    writer.post([(box, delta(1)), (box, finish())])  # the step loop's last events, then it stops the server
    stopping = threading.Thread(target=writer.stop)
    stopping.start()
    rec.release.set()
    stopping.join(WAIT)
    assert not stopping.is_alive()
    assert [type(m).__name__ for m in read_frames(peer, 3)] == ["Delta", "Delta", "Finish"]
    assert loop.items == [DONE]
    receive.close()
    box.stream.close()


def test_what_cannot_be_written_goes_to_the_event_loop_in_order(writer, loop, pair):
    ours, peer = pair
    box, rec, receive = client(ours)
    box.open(None, 1)  # the event loop holds this socket (its relay is catching up)
    writer.post([(box, delta(0))])
    writer.post([(box, delta(1)), (box, finish())])
    writer.stop()
    assert [getattr(m, "completion_tokens", m) for m in loop.items] == [1, 2, 1, DONE]
    assert rec.writes == []
    receive.close()
    box.stream.close()


class Buggy(Recording):
    """A socket whose write raises what no socket raises: a bug in delivery."""

    def send(self, data: bytes) -> int:
        raise ValueError("a bug in delivery")


def test_a_failing_delivery_ends_its_own_request_with_an_error_and_no_one_else(writer, loop, pair):
    ours, peer = pair
    other_ours, other_peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    box, rec, receive = client(ours)
    broken, _, broken_receive = client(other_ours)
    broken.open(Buggy(other_ours), 1)
    try:
        writer.post([(broken, delta(0, "other")), (box, delta(0))])  # the same step
        writer.post([(broken, delta(1, "other"))])  # its later events go nowhere
        writer.post([(box, delta(1))])  # a later step
        got = read_frames(peer, 2)
        writer.stop()
        assert [m.completion_tokens for m in got] == [1, 2]
        error, end = loop.items
        assert isinstance(error, Error) and error.code == "generation_failed" and error.request_id == "other"
        assert end is ABANDONED  # the relay ends it unfinished: the step loop withdraws it
    finally:
        other_ours.close()
        other_peer.close()
        for s in (receive, box.stream, broken_receive, broken.stream):
            s.close()


def test_a_dead_writer_thread_stops_the_step_loop_at_its_next_post(pair, caplog):
    def closed_loop(queued):
        raise RuntimeError("Event loop is closed")

    writer = Writer(closed_loop)
    writer.start()
    ours, peer = pair
    box, rec, receive = client(ours)
    with caplog.at_level(logging.CRITICAL, logger="engine.rank0.writer"):
        writer.post([(box, finish())])  # its DONE needs the event loop
        writer._thread.join(WAIT)
    assert not writer._thread.is_alive()
    assert "the writer thread failed" in caplog.text
    with pytest.raises(WriterFailed, match="Event loop is closed"):
        writer.post([(box, delta(0))])
    writer.stop()
    receive.close()
    box.stream.close()
