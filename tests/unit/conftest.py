"""Shared fixtures: the anyio backend, and for the API tests a fake engine on the real wire protocol."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial

import anyio
import httpx
import pytest

import ipc
from api import create_app
from config import Settings, load_settings

Script = Callable[[ipc.FramedStream, ipc.Generate], Awaitable[None]]


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeEngine:
    """Engine rank 0 as the API sees it: answers InfoRequest, plays a script for each Generate."""

    def __init__(self) -> None:
        self.info = ipc.Info(
            model="test-model",
            model_path="/models/test-model",
            context_length=4096,
            ranks=2,
            backend="ring",
            created=1_700_000_000,
            engine_pid=4242,
        )
        self.generates: list[ipc.Generate] = []
        self.helper_requests: list[ipc.Embed | ipc.Rerank] = []  # answered by helper_answer
        self.token_requests: list[ipc.Tokenize | ipc.Detokenize] = []
        # answers Tokenize (a token per character) and Detokenize (a character per token); a test may swap it
        self.token_answer: Callable[[ipc.Msg], ipc.Msg] = _characters
        # answers Embed (input i: the unit vector along i, in as many frames as inputs) and Rerank (1/(1+i))
        self.helper_answer: Callable[[ipc.Msg], list[ipc.Msg]] = _unit_vectors
        self.received = anyio.Event()  # a Generate arrived
        self.peer_closed = anyio.Event()  # the API closed a connection we were holding open
        self.script: Script = self._reply
        self._pieces = ["Hello", " world"]
        self._finish_reason = "stop"
        self.cached_tokens = 0  # what the first Delta and Finish say the prefix cache held of the 7-token prompt

    # ---- scripts a test picks

    def reply_with(self, pieces: list[str], finish_reason: str = "stop") -> None:
        """Started, one Delta per piece, Finish."""
        self._pieces, self._finish_reason, self.script = pieces, finish_reason, self._reply

    def refuse(self, error: ipc.Error) -> None:
        """Answer the Generate with an Error instead of Started."""

        async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
            await conn.send(error)

        self.script = script

    def die_after(self, pieces: list[str]) -> None:
        """Started, the pieces, then drop the connection as a crashing engine would."""

        async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
            await conn.send(ipc.Started(request_id=msg.request_id, prompt_tokens=3))
            for i, piece in enumerate(pieces, 1):
                await conn.send(ipc.Delta(request_id=msg.request_id, text=piece, completion_tokens=i))

        self.script = script

    def hold(self, pieces: list[str] | None) -> None:
        """Started and the pieces (or, with None, not even Started), then wait for the API to close."""

        async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
            if pieces is not None:
                await conn.send(ipc.Started(request_id=msg.request_id, prompt_tokens=3))
                for i, piece in enumerate(pieces, 1):
                    await conn.send(ipc.Delta(request_id=msg.request_id, text=piece, completion_tokens=i))
            try:
                await conn.recv()
            except ipc.ConnectionClosed:
                self.peer_closed.set()

        self.script = script

    # ---- the server side

    async def _reply(self, conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        rid = msg.request_id
        await conn.send(ipc.Started(request_id=rid, prompt_tokens=7))
        # as rank 0 does when the request joins the batch
        await conn.send(ipc.Delta(request_id=rid, text="", completion_tokens=0, cached_tokens=self.cached_tokens))
        for i, piece in enumerate(self._pieces, 1):
            await conn.send(ipc.Delta(request_id=rid, text=piece, completion_tokens=i))
        await conn.send(
            ipc.Finish(request_id=rid, finish_reason=self._finish_reason, prompt_tokens=7,
                       completion_tokens=len(self._pieces), cached_tokens=self.cached_tokens)
        )

    async def handle(self, conn: ipc.FramedStream) -> None:
        msg = await conn.recv()
        if isinstance(msg, ipc.InfoRequest):
            await conn.send(self.info)
            return
        if isinstance(msg, ipc.Embed | ipc.Rerank):
            self.helper_requests.append(msg)
            for frame in self.helper_answer(msg):
                await conn.send(frame)
            return
        if isinstance(msg, ipc.Tokenize | ipc.Detokenize):
            self.token_requests.append(msg)
            await conn.send(self.token_answer(msg))
            return
        assert isinstance(msg, ipc.Generate)
        self.generates.append(msg)
        self.received.set()
        await self.script(conn, msg)


def _unit_vectors(msg: ipc.Msg) -> list[ipc.Msg]:
    if isinstance(msg, ipc.Rerank):
        return [ipc.Reranked(request_id=msg.request_id, scores=[1 / (1 + i) for i in range(len(msg.documents))],
                             prompt_tokens=10 * len(msg.documents))]
    assert isinstance(msg, ipc.Embed)
    width = msg.dimensions or 8
    rows = [struct.pack(f"<{width}f", *(float(j == i % width) for j in range(width))) for i in range(len(msg.inputs))]
    return [ipc.Embedded(request_id=msg.request_id, embeddings=[row], prompt_tokens=3 * len(rows), dimensions=width,
                         index=i, more=i + 1 < len(rows)) for i, row in enumerate(rows)]


def _characters(msg: ipc.Msg) -> ipc.Msg:
    if isinstance(msg, ipc.Detokenize):
        return ipc.Detokenized(prompt="".join(map(chr, msg.tokens)))
    assert isinstance(msg, ipc.Tokenize)
    text = msg.prompt or "".join(str(m.get("content", "")) for m in msg.messages)
    tokens = [ord(c) for c in text]
    return ipc.Tokenized(tokens=tokens, max_model_len=4096, token_strs=list(text) if msg.return_token_strs else None)


@pytest.fixture
def socket_path() -> Iterator[str]:
    # short on purpose: Unix socket paths are limited to ~104 bytes
    folder = tempfile.mkdtemp(dir="/tmp", prefix="mcs-")
    yield os.path.join(folder, "e.sock")
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
async def engine(socket_path: str) -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    async with anyio.create_task_group() as tg:
        await tg.start(partial(ipc.serve_unix, socket_path, fake.handle))
        yield fake
        tg.cancel_scope.cancel()


@pytest.fixture
def make_settings(socket_path: str) -> Callable[..., Settings]:
    def make(**overrides: object) -> Settings:
        environ = {"MODEL": "test-model", "SOCKET_PATH": socket_path, **{k: str(v) for k, v in overrides.items()}}
        return load_settings(environ=environ, env_file=os.path.join(os.path.dirname(socket_path), "no.env"))

    return make


@pytest.fixture
def make_client(make_settings: Callable[..., Settings]) -> Callable[..., AsyncIterator[httpx.AsyncClient]]:
    """make_client(**settings) -> async context manager of an httpx client bound to a fresh app."""

    @asynccontextmanager
    async def make(**overrides: object) -> AsyncIterator[httpx.AsyncClient]:
        transport = httpx.ASGITransport(app=create_app(make_settings(**overrides)))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            yield client

    return make


@pytest.fixture
async def client(make_client: Callable[..., AsyncIterator[httpx.AsyncClient]]) -> AsyncIterator[httpx.AsyncClient]:
    async with make_client() as c:
        yield c
