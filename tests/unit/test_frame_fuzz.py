"""Property tests of the frame reader: hostile bytes never crash it, hang it, or make it allocate.

Whatever arrives, the reader returns a Message, or raises FrameError (the server answers with
an error frame and closes) or ConnectionClosed; nothing else, and never memory beyond the
frame limit for a declared length it has not received.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import tracemalloc
from functools import partial
from pathlib import Path

import anyio
import anyio.abc
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ipc import (
    PROTOCOL_VERSION,
    ConnectionClosed,
    Error,
    FrameError,
    FramedStream,
    Hello,
    Info,
    InfoRequest,
    Msg,
    TruncatedFrame,
    Welcome,
    serve_unix,
)
from ipc.framing import HEADER, decode_message, encode_frame
from ipc.messages import Message
from ipc.probe import fetch_info
from tests.wire import deeply_nested_generate

TIMEOUT = 5.0
MAX_FRAME = 64 * 1024

TAGS = [cls.__name__.lower() for cls in Message.__args__] + ["nosuchmessage", ""]
# msgpack values a hostile peer could nest into a message
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(), st.text(max_size=20),
                    st.binary(max_size=20))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=10), inner, max_size=4)),
                      max_leaves=20)
messages = st.dictionaries(st.sampled_from(["type", "version", "client", "request_id", "kind", "params",
                                            "messages", "prompt", "text", "status", "message", "tokens", "x"]),
                           values, max_size=6) | st.builds(
    lambda tag, rest: {"type": tag, **rest}, st.sampled_from(TAGS),
    st.dictionaries(st.text(max_size=12), values, max_size=5))

FUZZ = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.binary(max_size=512))
def test_random_bodies_decode_or_raise_frame_error(body: bytes) -> None:
    try:
        assert isinstance(decode_message(body), Msg)
    except FrameError:
        pass


@pytest.mark.parametrize("depth", [10_000, 200_000])
def test_a_message_nested_past_the_decoders_depth_is_a_frame_error(depth: int) -> None:
    with pytest.raises(FrameError, match="nested too deeply"):
        decode_message(deeply_nested_generate(depth))


@FUZZ
@given(messages)
def test_structured_garbage_decodes_or_raises_frame_error(obj: dict) -> None:
    try:
        body = msgspec.msgpack.encode(obj)
    except (TypeError, OverflowError):
        return  # not encodable as msgpack (huge int): no peer can send it either
    try:
        assert isinstance(decode_message(body), Msg)
    except FrameError:
        pass


async def _read_all(data: bytes, max_frame: int = MAX_FRAME) -> list[Msg | Exception]:
    """Feed data (then EOF) to a FramedStream; what each recv() gave, until it stops."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    left = await anyio.abc.UNIXSocketStream.from_socket(a)
    right = await anyio.abc.UNIXSocketStream.from_socket(b)
    out: list[Msg | Exception] = []
    async with left, right, anyio.create_task_group() as tg:

        async def feed() -> None:
            try:
                await right.send(data)
                await right.send_eof()
            except (anyio.BrokenResourceError, OSError):
                pass  # the reader gave up first

        tg.start_soon(feed)
        conn = FramedStream(left, max_frame)
        with anyio.fail_after(TIMEOUT):
            while True:
                try:
                    out.append(await conn.recv())
                except (FrameError, ConnectionClosed) as exc:
                    out.append(exc)
                    break
        await left.aclose()
    return out


def frames(items: list[Msg | bytes]) -> bytes:
    return b"".join(encode_frame(i) if isinstance(i, Msg) else i for i in items)


@FUZZ
@given(st.lists(st.one_of(st.binary(max_size=64), st.just(encode_frame(InfoRequest())),
                          st.builds(lambda n, tail: HEADER.pack(n) + tail, st.integers(0, 2**32 - 1),
                                    st.binary(max_size=32))), max_size=6))
def test_random_streams_end_in_messages_frame_errors_or_closed(pieces: list[bytes]) -> None:
    results = anyio.run(_read_all, b"".join(pieces))
    *msgs, last = results
    assert all(isinstance(m, Msg) for m in msgs)
    assert isinstance(last, (FrameError, ConnectionClosed))


@FUZZ
@given(st.integers(MAX_FRAME + 1, 2**32 - 1), st.binary(max_size=256))
def test_a_declared_length_over_the_limit_is_refused_without_reading_it(length: int, tail: bytes) -> None:
    results = anyio.run(_read_all, HEADER.pack(length) + tail)
    assert len(results) == 1 and isinstance(results[0], FrameError)
    assert str(length) in str(results[0])


@settings(max_examples=30, deadline=None, database=None)
@given(st.integers(0, 2**32 - 1), st.binary(max_size=1024))
def test_memory_stays_within_the_frame_limit_whatever_length_is_declared(length: int, tail: bytes) -> None:
    """A header may promise 4 GiB; the reader holds at most what arrived (and one bounded recv)."""

    async def measure() -> int:
        tracemalloc.start()
        try:
            await _read_all(HEADER.pack(length) + tail)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    peak = anyio.run(measure)
    assert peak < MAX_FRAME + 512 * 1024, peak


# ---- the same against a live server: serve_unix with the engine's handshake and a tiny handler


@pytest.fixture
def short_dir():
    path = Path(tempfile.mkdtemp(dir="/tmp", prefix="fz-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


async def _attack_then_probe(path: Path, data: bytes) -> tuple[list[Msg], object]:
    info = Info(model="m", model_path="/m", context_length=8, ranks=1, backend="single", created=0, engine_pid=1)

    async def handler(conn: FramedStream) -> None:
        try:
            with anyio.fail_after(TIMEOUT):
                msg = await conn.recv()
        except (FrameError, TruncatedFrame, TimeoutError) as exc:  # as engine/rank0/server.py does
            await conn.send(Error(status=400, code="bad_frame", message=str(exc)))
            return
        if isinstance(msg, InfoRequest):
            await conn.send(info)
        else:
            await conn.send(Error(status=400, code="bad_frame", message="?"))

    replies: list[Msg] = []
    async with anyio.create_task_group() as tg:
        await tg.start(partial(serve_unix, max_frame=MAX_FRAME), path, handler)
        with anyio.fail_after(TIMEOUT):
            stream = await anyio.connect_unix(str(path))
            async with stream:
                try:
                    await stream.send(data)
                    await stream.send_eof()
                except (anyio.BrokenResourceError, OSError):
                    pass
                conn = FramedStream(stream)
                while True:
                    try:
                        replies.append(await conn.recv())
                    except ConnectionClosed:
                        break
            probed = await fetch_info(str(path), TIMEOUT)
        tg.cancel_scope.cancel()
    return replies, probed


@settings(max_examples=40, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.booleans(), st.binary(max_size=128), st.integers(0, 2**32 - 1))
def test_a_live_server_answers_garbage_with_an_error_frame_and_keeps_serving(
    short_dir: Path, say_hello: bool, garbage: bytes, declared: int
) -> None:
    path = short_dir / "s.sock"
    path.unlink(missing_ok=True)
    hello = encode_frame(Hello(version=PROTOCOL_VERSION, client="fuzz")) if say_hello else b""
    data = hello + HEADER.pack(declared) + garbage
    replies, probed = anyio.run(_attack_then_probe, path, data)
    # Welcome to our hello, then one answer to the garbage (an error frame, or a reply if it
    # happened to be a valid message): never undecodable bytes, never silence.
    if say_hello:
        assert len(replies) == 2 and isinstance(replies[0], Welcome)
    else:
        assert 1 <= len(replies) <= 2
    assert isinstance(replies[-1], Msg)
    assert probed.model == "m"
