"""The API <-> engine wire: frames, the message union, the handshake over a real Unix socket."""

from __future__ import annotations

import asyncio
import fcntl
import logging
import resource
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest

from ipc import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    Delta,
    Detokenize,
    Detokenized,
    Embed,
    Embedded,
    HelperHello,
    HelperState,
    HelperWelcome,
    EngineUnavailable,
    Error,
    Finish,
    FrameError,
    FramedStream,
    FrameTooLarge,
    Generate,
    Hello,
    Info,
    InfoRequest,
    Msg,
    Rerank,
    Reranked,
    SamplingParams,
    Started,
    Tokenize,
    Tokenized,
    Welcome,
    connect,
    decode_message,
    encode_frame,
    ignore_settled_wakeups,
    serve_unix,
)
from ipc.framing import HEADER
from ipc.messages import Message, ModelFacts, RankState
from ipc.probe import fetch_info
from ops.procs import poll
from tests import wire

TIMEOUT = 5

INFO = Info(
    model="demo-tiny",
    model_path="/models/demo-tiny",
    context_length=2048,
    ranks=2,
    backend="ring",
    created=1_700_000_000,
    engine_pid=4242,
    step=7,
    last_step_age=0.25,
    active=1,
    queued=2,
    rank_states=[RankState(rank=0, host="127.0.0.1", pid=4242, step=7), RankState(rank=1, step=7)],
    facts=ModelFacts(architecture="qwen3", parameters=213_376, weight_bytes=856_041, dtype="float32",
                     config={"hidden_size": 64, "rms_norm_eps": 1e-06, "tie_word_embeddings": False,
                             "hidden_act": "silu"}, chat_template="{{ messages }}", thinking=True, tool_calling=True),
)

SAMPLES: list[Msg] = [
    Hello(version=PROTOCOL_VERSION, client="api"),
    Welcome(version=PROTOCOL_VERSION, engine_pid=123),
    InfoRequest(),
    INFO,
    Generate(
        request_id="chatcmpl-0123abcd",
        kind="chat",
        params=SamplingParams(
            max_tokens=32, temperature=0.0, seed=3, stop=["\n\n"], logit_bias={17: -100.0}, repetition_penalty=1.1
        ),
        messages=[{"role": "user", "content": "hello"}],
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
    ),
    Generate(request_id="cmpl-1", kind="completion", params=SamplingParams(max_tokens=4), prompt=[1, 2, 3], echo=True),
    Started(request_id="chatcmpl-1", prompt_tokens=12),
    Delta(request_id="chatcmpl-1", text="héllo ✓", completion_tokens=3),
    Finish(request_id="chatcmpl-1", finish_reason="length", prompt_tokens=12, completion_tokens=32, text="x"),
    Finish(request_id="chatcmpl-1", finish_reason="stop", prompt_tokens=12, completion_tokens=3, stop_sequence="\n\n"),
    Tokenize(kind="chat", messages=[{"role": "user", "content": "hello"}], enable_thinking=False,
             return_token_strs=True),
    Tokenize(kind="completion", prompt="héllo", add_special_tokens=False),
    Tokenized(tokens=[1, 2, 3], max_model_len=2048, token_strs=["a", "b", "c"]),
    Detokenize(tokens=[1, 2, 3]),
    Detokenized(prompt="héllo"),
    Embed(request_id="emb-1", inputs=["héllo", [1, 2, 3]], truncate=True, dimensions=32),
    Embedded(request_id="emb-1", embeddings=[b"\x00\x00\x80?" * 2], prompt_tokens=5, dimensions=2, more=True),
    Rerank(request_id="rr-1", query="q", documents=["a", ""]),
    Reranked(request_id="rr-1", scores=[0.25, 1.0], prompt_tokens=9),
    HelperHello(version=PROTOCOL_VERSION, token=(1 << 62) - 1),
    HelperWelcome(version=PROTOCOL_VERSION, helpers=[HelperState(kind="embedding", name="e", rank=1, weight_bytes=7)]),
    Error(status=429, message="queue full", code="overloaded", request_id="chatcmpl-1"),
]


def test_samples_cover_every_message_type() -> None:
    assert {type(m) for m in SAMPLES} == set(Message.__args__)


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: type(m).__name__)
def test_frame_round_trip(msg: Msg) -> None:
    frame = encode_frame(msg)
    (length,) = HEADER.unpack(frame[: HEADER.size])
    assert length == len(frame) - HEADER.size
    assert decode_message(frame[HEADER.size :]) == msg


def test_message_tag_is_the_lowercase_class_name() -> None:
    body = encode_frame(InfoRequest())[HEADER.size :]
    assert msgspec.msgpack.decode(body) == {"type": "inforequest"}


@pytest.mark.parametrize(
    "body",
    [
        b"\xc1\xc1\xc1",  # not msgpack at all
        msgspec.msgpack.encode({"type": "nosuchmessage"}),
        msgspec.msgpack.encode({"type": "hello"}),  # required field missing
        msgspec.msgpack.encode({"type": "hello", "version": "one"}),  # wrong field type
        msgspec.msgpack.encode({"type": "cancel", "request_id": "r", "extra": 1}),  # unknown field
        b"",
    ],
)
def test_garbage_body_raises_frame_error(body: bytes) -> None:
    with pytest.raises(FrameError):
        decode_message(body)


@asynccontextmanager
async def stream_pair(max_frame: int = 1 << 20) -> AsyncIterator[tuple[FramedStream, anyio.abc.SocketStream]]:
    """A FramedStream and the raw socket stream at the other end of a socketpair."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = await anyio.abc.UNIXSocketStream.from_socket(a)
    right = await anyio.abc.UNIXSocketStream.from_socket(b)
    async with left, right:
        yield FramedStream(left, max_frame), right


@pytest.mark.anyio
async def test_framed_stream_round_trip_of_every_message() -> None:
    async with stream_pair() as (conn, raw):
        peer = FramedStream(raw)
        with anyio.fail_after(TIMEOUT):
            for msg in SAMPLES:
                await conn.send(msg)
                assert await peer.recv() == msg


@pytest.mark.anyio
async def test_incoming_frame_over_max_frame_is_refused() -> None:
    async with stream_pair(max_frame=64) as (conn, raw):
        with anyio.fail_after(TIMEOUT):
            await raw.send(HEADER.pack(65) + b"x" * 65)
            with pytest.raises(FrameTooLarge):
                await conn.recv()


@pytest.mark.anyio
async def test_outgoing_frame_over_max_frame_is_refused() -> None:
    async with stream_pair(max_frame=64) as (conn, _raw):
        with anyio.fail_after(TIMEOUT), pytest.raises(FrameTooLarge):
            await conn.send(Delta(request_id="r", text="x" * 100, completion_tokens=1))


@pytest.mark.anyio
@pytest.mark.parametrize("data", [b"", b"\x00\x00", HEADER.pack(100) + b"x" * 10], ids=["empty", "half-header", "half-body"])
async def test_truncated_frame_raises_connection_closed(data: bytes) -> None:
    async with stream_pair() as (conn, raw):
        with anyio.fail_after(TIMEOUT):
            if data:
                await raw.send(data)
            await raw.send_eof()
            with pytest.raises(ConnectionClosed):
                await conn.recv()


@pytest.mark.anyio
async def test_garbage_frame_on_the_stream_raises_frame_error() -> None:
    async with stream_pair() as (conn, raw):
        with anyio.fail_after(TIMEOUT):
            await raw.send(HEADER.pack(4) + b"\xc1\xc1\xc1\xc1")
            with pytest.raises(FrameError):
                await conn.recv()


async def _recv_ended_as_bytes_arrive(conn: FramedStream, raw: anyio.abc.SocketStream, frame: bytes) -> None:
    """A recv() cancelled in the loop turn in which the peer's bytes make its socket readable: a request
    ending just as its client writes or leaves."""
    async with anyio.create_task_group() as tg:
        tg.start_soon(conn.recv)
        await anyio.wait_all_tasks_blocked()
        await raw.send(frame)  # in conn's socket now: the next loop turn sees it readable
        await anyio.lowlevel.checkpoint()  # this task runs first in that turn, ahead of the reader's callback
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_a_wait_that_ends_as_bytes_arrive_logs_no_error_and_loses_nothing(caplog) -> None:
    caplog.set_level(logging.DEBUG, "ipc.framing")
    ignore_settled_wakeups(asyncio.get_running_loop())
    msg = Delta(request_id="r", text="kept", completion_tokens=1)
    async with stream_pair() as (conn, raw):
        with anyio.fail_after(TIMEOUT):
            for _ in range(3):
                await _recv_ended_as_bytes_arrive(conn, raw, encode_frame(msg))
                await anyio.sleep(0)  # the loop turn that used to log "Exception in callback Future.set_result"
                assert await conn.recv() == msg
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    # The race did happen each time (the test stands for something): the handler saw it and let it go.
    assert sum("nothing was lost" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.anyio
@pytest.mark.parametrize("earlier", [True, False], ids=["earlier-handler", "default-handler"])
async def test_other_callback_errors_still_reach_the_loops_handler(caplog, earlier: bool) -> None:
    loop = asyncio.get_running_loop()
    runners = loop.get_exception_handler()
    seen: list[dict] = []
    loop.set_exception_handler((lambda _loop, context: seen.append(context)) if earlier else None)
    ignore_settled_wakeups(loop)

    def broken() -> None:
        raise RuntimeError("a real bug")

    try:
        loop.call_soon(broken)
        await anyio.sleep(0)
        await anyio.sleep(0)
    finally:
        loop.set_exception_handler(runners)
    if earlier:
        assert [str(c["exception"]) for c in seen] == ["a real bug"]
    else:
        errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.name == "asyncio"]
        assert len(errors) == 1 and "a real bug" in str(errors[0].exc_info[1])


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # Unix socket paths are limited to ~104 bytes: pytest's tmp_path can be longer.
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="ipc-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


Handler = Callable[[FramedStream], Awaitable[None]]


async def answer_info(conn: FramedStream) -> None:
    """A tiny engine: answers every InfoRequest with INFO until the client leaves."""
    while True:
        try:
            msg = await conn.recv()
        except ConnectionClosed:
            return
        if isinstance(msg, InfoRequest):
            await conn.send(INFO)


@asynccontextmanager
async def serving(path: Path, handler: Handler = answer_info) -> AsyncIterator[None]:
    """Serve on path; on exit wait for every handler to see its client leave, then stop."""
    running = 0
    idle = anyio.Event()

    async def tracked(conn: FramedStream) -> None:
        nonlocal running, idle
        running += 1
        idle = anyio.Event()
        try:
            await handler(conn)
        finally:
            running -= 1
            if not running:
                idle.set()

    async with anyio.create_task_group() as tg:
        with anyio.fail_after(TIMEOUT):
            await tg.start(serve_unix, path, tracked)
        yield
        # anyio 4.16 (asyncio, Unix sockets) logs InvalidStateError when a read is cancelled in
        # the very loop iteration its socket turns readable; so let handlers end on EOF first.
        with anyio.fail_after(TIMEOUT):
            if running:
                await idle.wait()
        tg.cancel_scope.cancel()


@pytest.mark.anyio
async def test_serve_and_connect_handshake(short_dir: Path) -> None:
    path = short_dir / "run" / "e.sock"
    async with serving(path):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_ISSOCK(path.stat().st_mode)
        with anyio.fail_after(TIMEOUT):
            conn = await connect(path, client="test")
            try:
                await conn.send(InfoRequest())
                assert await conn.recv() == INFO
            finally:
                await conn.aclose()
            assert await fetch_info(str(path), TIMEOUT) == INFO


async def _raw_exchange(path: Path, first: Msg) -> Msg:
    stream = await anyio.connect_unix(str(path))
    async with stream:
        conn = FramedStream(stream)
        await conn.send(first)
        reply = await conn.recv()
        # The server hangs up after a failed handshake.
        with pytest.raises(ConnectionClosed):
            await conn.recv()
        return reply


@pytest.mark.anyio
async def test_wrong_protocol_version_gets_an_error_frame(short_dir: Path) -> None:
    path = short_dir / "e.sock"
    async with serving(path):
        with anyio.fail_after(TIMEOUT):
            reply = await _raw_exchange(path, Hello(version=PROTOCOL_VERSION + 1, client="future"))
    assert isinstance(reply, Error)
    assert reply.code == "protocol_version_mismatch"
    assert f"v{PROTOCOL_VERSION + 1}" in reply.message


@pytest.mark.anyio
async def test_first_frame_other_than_hello_gets_an_error_frame(short_dir: Path) -> None:
    path = short_dir / "e.sock"
    async with serving(path):
        with anyio.fail_after(TIMEOUT):
            reply = await _raw_exchange(path, InfoRequest())
    assert isinstance(reply, Error)
    assert reply.status == 400
    assert "hello" in reply.message


@pytest.mark.anyio
async def test_garbage_handshake_gets_an_error_frame_and_the_server_keeps_serving(short_dir: Path) -> None:
    path = short_dir / "e.sock"
    async with serving(path):
        with anyio.fail_after(TIMEOUT):
            stream = await anyio.connect_unix(str(path))
            async with stream:
                await stream.send(HEADER.pack(3) + b"\xc1\xc1\xc1")
                reply = await FramedStream(stream).recv()
            assert isinstance(reply, Error) and reply.code == "bad_frame"
            assert await fetch_info(str(path), TIMEOUT) == INFO


@pytest.mark.anyio
async def test_connect_to_a_missing_socket_raises_engine_unavailable(short_dir: Path) -> None:
    with anyio.fail_after(TIMEOUT), pytest.raises(EngineUnavailable, match="not accepting connections"):
        await connect(short_dir / "absent.sock")


@pytest.mark.anyio
async def test_connect_reports_the_servers_version_error(short_dir: Path) -> None:
    path = short_dir / "e.sock"

    async def old_engine(stream: anyio.abc.SocketStream) -> None:
        async with stream:
            conn = FramedStream(stream)
            await conn.recv()
            await conn.send(Error(status=503, code="protocol_version_mismatch",
                                  message="protocol version mismatch: peer speaks v1, this side speaks v0"))

    listener = await anyio.create_unix_listener(path)
    async with listener, anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, old_engine)
        with anyio.fail_after(TIMEOUT), pytest.raises(EngineUnavailable, match="protocol version mismatch"):
            await connect(path)
        tg.cancel_scope.cancel()


def test_probe_exits_1_when_nobody_answers(short_dir: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ipc.probe", "--socket", str(short_dir / "absent.sock"), "--timeout", "2"],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    assert "engine not answering" in proc.stderr


# A server process with few file descriptors to spare: it answers each handshaken connection's frame.
SCARCE_SERVER = """
import resource, sys, logging, anyio
from ipc import Error, serve_unix
logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(message)s")
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[2]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
async def answer(conn):
    await conn.recv()
    await conn.send(Error(status=400, code="served", message="served"))
async def main():
    async with anyio.create_task_group() as tg:
        await tg.start(serve_unix, sys.argv[1], answer)
        print("listening", flush=True)
anyio.run(main)
"""


def test_a_listener_out_of_file_descriptors_accepts_again_once_some_are_free(short_dir: Path) -> None:
    path = short_dir / "e.sock"
    log = short_dir / "server.log"
    with open(log, "w") as err:
        server = subprocess.Popen([sys.executable, "-c", SCARCE_SERVER, str(path), "24"],
                                  cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE, stderr=err, text=True)
    held: list[socket.socket] = []
    try:
        assert server.stdout is not None and server.stdout.readline() == "listening\n", log.read_text()
        for _ in range(48):  # more than it has descriptors for: the rest wait in the listen backlog
            c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            c.connect(str(path))
            held.append(c)
        poll(lambda: "cannot accept connections" in log.read_text(), TIMEOUT, 0.05)
        assert "cannot accept connections" in log.read_text(), log.read_text()
        for c in held:
            c.close()
        held.clear()
        # The same limit still holds: it serves again by itself once the burst's sockets are gone.
        poll(lambda: "accepting connections on" in log.read_text(), TIMEOUT, 0.05)
        with wire.Session(path, timeout=TIMEOUT) as session:
            session.send(InfoRequest())
            reply = session.recv()
            assert isinstance(reply, Error) and reply.code == "served", reply
        assert server.poll() is None, log.read_text()
    finally:
        for c in held:
            c.close()
        server.kill()
        server.wait(TIMEOUT)
        if server.stdout is not None:
            server.stdout.close()


@pytest.mark.anyio
async def test_arrived_answers_for_a_socket_numbered_past_1024() -> None:
    # A busy API holds thousands of sockets; select() cannot watch one numbered 1024 or more.
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] <= 1100:
        pytest.skip("this process may not open a descriptor past 1024")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    high = socket.socket(fileno=fcntl.fcntl(ours.fileno(), fcntl.F_DUPFD, 1024))
    ours.close()
    high.setblocking(False)
    conn = FramedStream(await anyio.abc.UNIXSocketStream.from_socket(high))
    try:
        assert high.fileno() >= 1024
        assert not conn.arrived()
        theirs.sendall(encode_frame(InfoRequest()))
        with anyio.fail_after(TIMEOUT):
            while not conn.arrived():
                await anyio.sleep(0.01)
            assert await conn.recv() == InfoRequest()
        theirs.close()
        assert conn.arrived()  # EOF: recv() answers at once
    finally:
        theirs.close()
        await conn.aclose()


@pytest.mark.anyio
async def test_a_send_cancelled_halfway_keeps_the_rest_so_the_next_frame_still_parses() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    ours.setblocking(False)
    conn = FramedStream(await anyio.abc.UNIXSocketStream.from_socket(ours))
    big = Delta(request_id="r", text="x" * 1_000_000, completion_tokens=1)
    try:
        with anyio.move_on_after(0.2):  # nobody reads: the send blocks partway through its frame
            await conn.send(big)
        assert 0 < len(conn.unsent) < len(encode_frame(big))
        received = bytearray()

        def drain() -> None:
            theirs.settimeout(TIMEOUT)
            while True:
                chunk = theirs.recv(1 << 20)
                if not chunk:
                    return
                received.extend(chunk)

        async with anyio.create_task_group() as tg:
            tg.start_soon(anyio.to_thread.run_sync, drain)
            with anyio.fail_after(TIMEOUT):
                await conn.send_bytes(bytes(conn.unsent))
                await conn.send(Error(status=408, code="client_not_reading", message="m"))
            await conn.aclose()
        assert conn.unsent == b""
        assert wire.frames(bytes(received)) == [big, Error(status=408, code="client_not_reading", message="m")]
    finally:
        theirs.close()
        await conn.aclose()
