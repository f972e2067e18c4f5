"""Rank 0's Outbox: the step thread writes a generation's events straight to its socket while the client keeps
up, and hands everything unsent to the event loop, in order, once a write would block or fail."""

from __future__ import annotations

import socket

import anyio
import pytest

from engine.rank0.outbox import DONE, Outbox
from ipc import Delta, Error, Finish
from ipc.framing import encode_frame
from tests.wire import frames


def delta(i: int, index: int = 0) -> Delta:
    return Delta(request_id="r", text=f"token {i} ", completion_tokens=i + 1, index=index)


def finish(index: int = 0) -> Finish:
    return Finish(request_id="r", finish_reason="stop", prompt_tokens=3, completion_tokens=1, index=index)


def read_all(sock: socket.socket) -> bytes:
    sock.setblocking(False)
    got = bytearray()
    while True:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return bytes(got)
        if not chunk:
            return bytes(got)
        got += chunk


STREAMS: list = []


@pytest.fixture(autouse=True)
def close_streams():
    yield
    while STREAMS:
        STREAMS.pop().close()


def stream(capacity: int):
    return streams(capacity)[0]


def streams(capacity: int):
    send, receive = anyio.create_memory_object_stream(capacity)
    STREAMS.extend((send, receive))
    return send, receive


@pytest.fixture
def pair():
    ours, peer = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()


def outbox(sock, choices: int = 1, max_frame: int = 1 << 20) -> Outbox:
    box = Outbox(stream(16), max_frame)
    box.open(sock, choices)
    return box


def relay_everything(box: Outbox, queued: list) -> None:
    """The event loop's part, with the relay's sends left out: every item into the stream and out again."""
    receive = STREAMS[STREAMS.index(box.stream) + 1]
    for _, item in queued:
        box.put(item)
    while box.stream.statistics().current_buffer_used:
        receive.receive_nowait()
    box.resume()


def test_a_reading_client_gets_every_event_from_the_step_thread_with_nothing_left_for_the_event_loop(pair):
    ours, peer = pair
    box = outbox(ours)
    queued: list = []
    box.deliver([delta(0)], queued)
    box.deliver([delta(1)], queued)
    assert queued == []
    box.deliver([delta(2), finish()], queued)
    assert queued == [(box, DONE)]  # the relay only hears that the generation ended
    assert frames(read_all(peer)) == [delta(0), delta(1), delta(2), finish()]


def test_the_generation_ends_after_every_choice_has_finished_or_at_an_error(pair):
    ours, peer = pair
    box = outbox(ours, choices=2)
    queued: list = []
    box.deliver([delta(0, 0), finish(0)], queued)
    assert queued == []
    box.deliver([finish(1)], queued)
    assert queued == [(box, DONE)]

    other = outbox(ours, choices=2)
    queued = []
    error = Error(status=400, code="invalid_request", message="bad", request_id="r")
    other.deliver([error], queued)
    assert queued == [(other, DONE)]
    assert frames(read_all(peer))[-1] == error


def test_a_client_that_stops_reading_gets_the_rest_through_the_event_loop_whole_and_in_order(pair):
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    box = outbox(ours)
    queued: list = []
    sent = [delta(i) for i in range(2000)]  # far more than the socket buffers hold
    for msg in sent:
        box.deliver([msg], queued)
    assert box.sock is None  # the socket went back to the event loop
    assert isinstance(queued[0][1], bytes)  # what the blocked write left unsent comes first
    rest = [item for _, item in queued]
    assert all(isinstance(item, Delta) for item in rest[1:])
    box.deliver([finish()], queued)
    assert queued[-2:] == [(box, finish()), (box, DONE)]
    # The client reads again: the socket's bytes, then the relay's, make every event once, in order.
    wire = read_all(peer) + b"".join(item if isinstance(item, bytes) else encode_frame(item)
                                     for _, item in queued if item is not DONE)
    assert frames(wire) == [*sent, finish()]


def test_once_the_relay_has_caught_up_the_step_thread_writes_again_and_the_client_gets_everything_in_order(pair):
    ours, peer = pair
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    send, receive = streams(4096)
    box = Outbox(send, max_frame=1 << 20)
    box.open(ours, 1)
    queued: list = []
    sent = [delta(i) for i in range(2000)]
    for msg in sent:
        box.deliver([msg], queued)
    assert box.sock is None
    box.resume()  # the relay has not even been handed the backlog yet
    assert box.sock is None
    # The event loop: each item into the stream, then the relay writes it (the client reads again meanwhile).
    wire = bytearray(read_all(peer))
    for _, item in queued:
        box.put(item)
    box.resume()  # the backlog waits in the stream
    assert box.sock is None
    while box.stream.statistics().current_buffer_used:
        data = receive.receive_nowait()
        data = data if isinstance(data, bytes) else encode_frame(data)
        while data:
            try:
                data = data[ours.send(data):]
            except BlockingIOError:
                wire += read_all(peer)
        box.resume()
    assert box.sock is ours
    queued = []
    box.deliver([delta(2000), finish()], queued)
    assert queued == [(box, DONE)]  # written by the step thread again
    wire += read_all(peer)
    assert frames(bytes(wire)) == [*sent, delta(2000), finish()]


def test_after_close_the_step_thread_never_touches_the_socket(pair):
    ours, peer = pair
    box = outbox(ours)
    box.close()
    queued: list = []
    box.deliver([delta(0), finish()], queued)
    assert queued == [(box, delta(0)), (box, finish()), (box, DONE)]
    relay_everything(box, queued)
    assert box.sock is None
    assert read_all(peer) == b""


def test_a_client_that_left_costs_the_step_thread_nothing_and_the_relay_hears_of_it(pair):
    ours, peer = pair
    box = outbox(ours)
    peer.close()
    queued: list = []
    box.deliver([delta(0)], queued)  # no exception on the step thread
    assert queued == [(box, delta(0))]  # the relay's send of it reports the closed connection
    relay_everything(box, queued)
    assert box.sock is None


def test_a_frame_over_the_limit_goes_to_the_relay_which_refuses_it(pair):
    ours, peer = pair
    box = outbox(ours, max_frame=64)
    queued: list = []
    big = Delta(request_id="r", text="x" * 200, completion_tokens=1)
    box.deliver([big], queued)
    assert queued == [(box, big)]
    assert read_all(peer) == b""


def test_a_full_outbox_cancels_its_generation():
    box = Outbox(stream(2), max_frame=1 << 20)

    async def main() -> bool:
        with anyio.CancelScope() as scope:
            box.scope = scope
            for i in range(3):
                box.put(delta(i))
            await anyio.sleep(5)
        return scope.cancelled_caught

    assert anyio.run(main)
    assert box.overflowed


def test_events_handed_to_the_event_loop_keep_their_order_with_later_direct_writes(pair):
    ours, peer = pair
    box = outbox(ours)
    queued: list = []
    box.deliver([delta(0)], queued)  # written directly
    box.deliver([delta(1)], queued, direct=False)  # a busy step: through the event loop
    assert queued == [(box, delta(1))] and box.sock is None
    box.deliver([delta(2)], queued)  # the relay has not caught up: it must wait its turn too
    assert queued == [(box, delta(1)), (box, delta(2))]
    receive = STREAMS[STREAMS.index(box.stream) + 1]
    for _, item in queued:
        box.put(item)
    wire = bytearray(read_all(peer))
    while box.stream.statistics().current_buffer_used:
        ours.send(encode_frame(receive.receive_nowait()))
        box.resume()
    assert box.sock is ours
    queued = []
    box.deliver([delta(3)], queued)
    assert queued == []
    wire += read_all(peer)
    assert frames(bytes(wire)) == [delta(0), delta(1), delta(2), delta(3)]
