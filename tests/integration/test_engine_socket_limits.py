"""Rank 0's socket at its limits: huge prompts arriving together, an output piece larger than a frame, and a
client that sends more than its one request on a connection (running out of file descriptors: test_ipc.py). Each either works
or gets a 4xx that says why, and the engine serves on."""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

import pytest

from ipc import Error, Finish, Generate, InfoRequest, SamplingParams, Started
from ipc.framing import HEADER
from tests import wire
from tests.harness import Stack, wait_for

CHAT = [{"role": "user", "content": "hello there"}]
NO_EOS = {0: -100.0, 1: -100.0, 2: -100.0}


def served_normally(path) -> None:
    """The engine answers a plain request to the end, and nothing is left running or queued."""
    msg = Generate(request_id="chatcmpl-afterwards", kind="chat", messages=CHAT,
                   params=SamplingParams(max_tokens=4, temperature=0.0))
    frames = wire.run(path, msg)
    assert isinstance(frames[0], Started) and isinstance(frames[-1], Finish), frames
    wait_for(lambda: (lambda i: i.active == 0 and i.queued == 0)(wire.info(path)), 10, "an idle engine")


def long_generation(rid: str) -> Generate:
    return Generate(request_id=rid, kind="chat", messages=CHAT,
                    params=SamplingParams(max_tokens=2000, temperature=0.0, logit_bias=NO_EOS))


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/<pid>/status")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads peak memory from Linux's /proc")
def test_huge_prompts_arriving_together_are_tokenised_one_at_a_time_not_all_at_once():
    # One malloc arena: memory one tokenisation freed is reused by the next on another worker thread, so the
    # peak measures how many ran at once, not how many threads kept their own freed memory.
    s = Stack(extra={"MALLOC_ARENA_MAX": "1"})
    engine = s.start_engine()
    try:
        pid = engine.popen.pid
        text = "hello world " * 200_000  # 2.4 MB: a tokenizer holds hundreds of MB for it at its peak

        def send(i: int) -> list:
            msg = Generate(request_id=f"cmpl-huge-{i}", kind="completion", prompt=text,
                           params=SamplingParams(max_tokens=1))
            return wire.run(s.socket, msg, timeout=120)

        before = peak_rss_kib(pid)
        frames = send(0)
        assert isinstance(frames[0], Error) and frames[0].code == "context_length_exceeded", frames
        one = peak_rss_kib(pid) - before
        assert one > 100 * 1024, f"one prompt raised the peak by {one} KiB only: too small to tell anything"
        with cf.ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(send, range(1, 5)))
        assert all(isinstance(f[0], Error) and f[0].code == "context_length_exceeded" for f in answers), answers
        four = peak_rss_kib(pid) - before
        # At once, four would need about four times the memory of one; in turn, about what one needed.
        assert four < 2 * one, f"peak memory: +{one} KiB for one huge prompt, +{four} KiB for four together"
        served_normally(s.socket)
    finally:
        engine.stop()


def test_an_output_piece_larger_than_a_frame_ends_with_a_400_naming_max_frame_bytes():
    s = Stack(extra={"MAX_FRAME_BYTES": "65536"})
    engine = s.start_engine()
    try:
        # Echo of 5000 copies of the demo's longest token (16 characters): one piece of 80 KB.
        msg = Generate(request_id="cmpl-echo", kind="completion", prompt=[1023] * 5000, echo=True,
                       params=SamplingParams(max_tokens=3))
        frames = wire.run(s.socket, msg)
        assert isinstance(frames[0], Started), frames
        last = frames[-1]
        assert isinstance(last, Error) and last.status == 400 and last.code == "output_too_large", frames
        assert "MAX_FRAME_BYTES" in last.message and last.request_id == "cmpl-echo"
        served_normally(s.socket)
        assert "Traceback" not in engine.log_tail(500)
    finally:
        engine.stop()


def test_a_second_request_on_a_generation_connection_ends_it_with_a_400_saying_so(stack):
    with wire.Session(stack.socket) as session:
        session.send(long_generation("chatcmpl-two-on-one"))
        assert isinstance(session.recv(), Started)
        session.send(InfoRequest())
        frames = []
        while (frame := session.recv()) is not None:
            frames.append(frame)
    last = frames[-1]
    assert isinstance(last, Error) and last.status == 400 and last.code == "bad_frame", frames[-3:]
    assert "connection of its own" in last.message and last.request_id == "chatcmpl-two-on-one"
    assert not any(isinstance(f, Finish) for f in frames)
    served_normally(stack.socket)


def test_broken_framing_after_a_request_ends_it_with_a_400_saying_so(stack):
    with wire.Session(stack.socket) as session:
        session.send(long_generation("chatcmpl-broken-after"))
        assert isinstance(session.recv(), Started)
        session.sock.sendall(HEADER.pack(3) + b"\xc1\xc1\xc1")  # 0xc1 is never valid msgpack
        frames = []
        while (frame := session.recv()) is not None:
            frames.append(frame)
    last = frames[-1]
    assert isinstance(last, Error) and last.code == "bad_frame" and "malformed message" in last.message, frames[-3:]
    served_normally(stack.socket)


def test_a_file_at_the_socket_path_stops_the_engine_with_a_message_and_stays():
    s = Stack()
    s.socket.parent.mkdir(parents=True)
    s.socket.write_text("not a socket")
    with pytest.raises(RuntimeError, match="exists and is not a socket"):
        s.start_engine(timeout=60)
    assert s.socket.read_text() == "not a socket"
