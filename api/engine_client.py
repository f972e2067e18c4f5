"""The engine as every dialect's endpoints see it (EngineClient), and its implementation over rank 0's
Unix socket: info calls and one connection per generation (closing it cancels the request)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Protocol, TypeVar

import anyio
import msgspec

import ipc
from api.access import tokens_arrived
from api.errors import (
    APIError,
    EngineUnavailable,
    GenerationFailed,
    GenerationTimeout,
    InvalidRequest,
    RequestTooLarge,
    from_wire,
)
from api.tenancy import salted

A = TypeVar("A", bound=ipc.Msg)

logger = logging.getLogger(__name__)


class Generation:
    """One admitted request; next_event() yields its Deltas, then its Finish, or raises APIError."""

    def __init__(self, conn: ipc.FramedStream, request_id: str, prompt_tokens: int, deadline: float, timeout: float):
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = 0
        # prompt tokens the engine took from its prefix cache (known from the first event: the engine sends a
        # Delta as each choice joins the batch)
        self.cached_tokens = 0
        self.done = False
        self._conn = conn
        self._deadline = deadline
        self._timeout = timeout
        self._closed = False
        self._tokens_seen: dict[int, int] = {}

    async def next_event(self) -> ipc.Delta | ipc.Finish:
        try:
            msg = await _recv(self._conn, self._deadline, self._timeout)
            if isinstance(msg, ipc.Error):
                raise from_wire(msg)
            if not isinstance(msg, ipc.Delta | ipc.Finish) or msg.request_id != self.request_id:
                raise GenerationFailed(f"the engine sent an unexpected {type(msg).__name__} frame")
            _check_calls(msg.tool_calls, self.request_id)
            # completion_tokens counts per choice (n > 1 interleaves them)
            tokens_arrived(msg.completion_tokens - self._tokens_seen.get(msg.index, 0))
            self._tokens_seen[msg.index] = msg.completion_tokens
            self.cached_tokens = max(self.cached_tokens, msg.cached_tokens)
            if isinstance(msg, ipc.Delta):
                self.completion_tokens = msg.completion_tokens
                return msg
            self.done = True
            self.prompt_tokens, self.completion_tokens = msg.prompt_tokens, msg.completion_tokens
            return msg
        except APIError:
            self.done = True
            raise

    def has_event(self) -> bool:
        """Whether next_event() can return at once (the engine's frames arrived faster than they were read)."""
        return self._conn.arrived()

    async def readable(self, timeout: float) -> bool:
        """True once an event may be read (or the deadline has passed); False after timeout idle seconds."""
        left = self._deadline - anyio.current_time()
        if left <= 0:
            return True  # next_event() then raises the timeout
        return await self._conn.readable(min(timeout, left)) or anyio.current_time() >= self._deadline

    async def aclose(self) -> None:
        """Close the connection (the engine then cancels the request if it still runs); idempotent."""
        if not self._closed:
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self._conn.aclose()


class EngineStalled(EngineUnavailable):
    """The engine's socket accepted, but no answer came in time: stuck (e.g. a rank frozen), not stopped."""


class EngineClient(Protocol):
    """What endpoints need from the engine; no dialect reaches past it to the transport."""

    last_info: ipc.Info | None  # the last Info seen (served while the engine is briefly away)
    stale: bool  # the engine was lost since last_info: it may come back serving another model
    reconnects: int  # times the engine came back after being lost

    async def info(self, timeout: float) -> ipc.Info:
        """Model, topology and live state; raises APIError (EngineUnavailable, EngineStalled)."""
        ...

    async def start(self, msg: ipc.Generate, timeout: float) -> Generation:
        """Admit msg (its events then come from the Generation) or raise the APIError it was refused with."""
        ...

    async def tokenize(self, msg: ipc.Tokenize, timeout: float) -> ipc.Tokenized:
        """The tokens of msg's prompt or chat, or the APIError it was refused with."""
        ...

    async def detokenize(self, msg: ipc.Detokenize, timeout: float) -> ipc.Detokenized:
        """The text of msg's ids, or the APIError they were refused with."""
        ...

    async def embed(self, msg: ipc.Embed, timeout: float) -> ipc.Embedded:
        """Every embedding of msg's inputs (one Embedded, however many frames carried it), or the APIError."""
        ...

    async def rerank(self, msg: ipc.Rerank, timeout: float) -> ipc.Reranked:
        """The relevance of each of msg's documents, or the APIError they were refused with."""
        ...


class SocketEngineClient:
    """EngineClient over rank 0's Unix socket; remembers the last Info for /v1/models."""

    def __init__(self, socket_path: str | Path, *, max_frame: int):
        self.socket_path = str(socket_path)
        self.max_frame = max_frame
        self.last_info: ipc.Info | None = None
        self.stale = False
        # times the engine came back after a failed connection, or Info named another engine process
        self.reconnects = 0
        self._connected_once = False
        self._lost = False
        self._counted = False

    async def info(self, timeout: float) -> ipc.Info:
        """One InfoRequest round trip bounded by timeout; raises EngineUnavailable with the reason."""
        try:
            reply = await self._ask(ipc.InfoRequest(), ipc.Info, timeout, "an info")
        except TimeoutError:
            raise EngineStalled(f"the engine did not answer an info request within {timeout:g} s") from None
        last = self.last_info
        if last is not None and (last.engine_pid, last.created) != (reply.engine_pid, reply.created) and not self._counted:
            self.reconnects += 1
        self._counted = False
        self.last_info, self.stale = reply, False
        return reply

    async def tokenize(self, msg: ipc.Tokenize, timeout: float) -> ipc.Tokenized:
        """One Tokenize round trip bounded by timeout."""
        try:
            return await self._ask(msg, ipc.Tokenized, timeout, "a tokenize")
        except TimeoutError:
            raise GenerationTimeout(f"the engine did not tokenize within the server's REQUEST_TIMEOUT of "
                                    f"{timeout:g} s") from None

    async def detokenize(self, msg: ipc.Detokenize, timeout: float) -> ipc.Detokenized:
        """One Detokenize round trip bounded by timeout."""
        try:
            return await self._ask(msg, ipc.Detokenized, timeout, "a detokenize")
        except TimeoutError:
            raise GenerationTimeout(f"the engine did not detokenize within the server's REQUEST_TIMEOUT of "
                                    f"{timeout:g} s") from None

    async def embed(self, msg: ipc.Embed, timeout: float) -> ipc.Embedded:
        """One Embed on a connection of its own; its Embedded frames joined (closing cancels what is left)."""
        parts: list[ipc.Embedded] = []
        try:
            first = await self._ask(msg, ipc.Embedded, timeout, "an embed", parts)
        except TimeoutError:
            raise GenerationTimeout(f"the engine did not compute the embeddings within the server's REQUEST_TIMEOUT "
                                    f"of {timeout:g} s") from None
        rows = [row for part in parts for row in part.embeddings]
        if len(rows) != len(msg.inputs):
            raise GenerationFailed(f"the engine sent {len(rows)} embeddings for {len(msg.inputs)} inputs")
        return msgspec.structs.replace(first, embeddings=rows, more=False)

    async def rerank(self, msg: ipc.Rerank, timeout: float) -> ipc.Reranked:
        """One Rerank round trip bounded by timeout."""
        try:
            reply = await self._ask(msg, ipc.Reranked, timeout, "a rerank")
        except TimeoutError:
            raise GenerationTimeout(f"the engine did not score the documents within the server's REQUEST_TIMEOUT "
                                    f"of {timeout:g} s") from None
        if len(reply.scores) != len(msg.documents):
            raise GenerationFailed(f"the engine sent {len(reply.scores)} scores for {len(msg.documents)} documents")
        return reply

    async def _ask(self, msg: ipc.Msg, answer: type[A], timeout: float, what: str,
                   parts: list | None = None) -> A:
        """Send msg on a connection of its own and return the engine's one answer, or raise the APIError it
        means; TimeoutError when none came within timeout (each caller says what that means)."""
        try:
            with anyio.fail_after(timeout):
                conn = await self._connect()
                try:
                    await _send_request(conn, msg)
                    reply = await conn.recv()
                    if parts is not None:  # an answer in several frames (Embedded: more)
                        parts.append(reply)
                        while getattr(parts[-1], "more", False):
                            parts.append(await conn.recv())
                        if not all(isinstance(p, answer) for p in parts):
                            reply = next(p for p in parts if not isinstance(p, answer))
                finally:
                    with anyio.CancelScope(shield=True):
                        await conn.aclose()
        except (ipc.ConnectionClosed, ipc.FrameError) as exc:
            raise EngineUnavailable(f"the engine dropped {what} request ({exc})") from None
        if isinstance(reply, ipc.Error):
            raise from_wire(reply)
        if not isinstance(reply, answer):
            raise EngineUnavailable(f"the engine answered {what} request with {type(reply).__name__}")
        return reply

    async def start(self, msg: ipc.Generate, timeout: float) -> Generation:
        """Send msg and wait until the engine admits it (Started) or refuses it (APIError)."""
        deadline = anyio.current_time() + timeout
        conn = await self._connect()
        try:
            await _send_request(conn, salted(msg))
            reply = await _recv(conn, deadline, timeout)
        except ipc.ConnectionClosed:
            # send() found the engine gone (e.g. it stopped right after the handshake)
            await _close(conn)
            raise EngineUnavailable("the engine closed the connection before accepting the request") from None
        except BaseException:
            await _close(conn)
            raise
        if isinstance(reply, ipc.Started) and reply.request_id == msg.request_id:
            return Generation(conn, msg.request_id, reply.prompt_tokens, deadline, timeout)
        await _close(conn)
        if isinstance(reply, ipc.Error):
            raise from_wire(reply)
        raise GenerationFailed(f"the engine answered a generate request with {type(reply).__name__}")

    async def _connect(self) -> ipc.FramedStream:
        try:
            conn = await ipc.connect(self.socket_path, client="api", max_frame=self.max_frame)
        except ipc.EngineUnavailable as exc:
            self._lost = self._connected_once
            self.stale = True
            raise EngineUnavailable(f"the engine is not available: {exc}") from None
        self._connected_once = True
        if self._lost:
            self._lost, self._counted = False, True
            self.reconnects += 1
        return conn


async def _send_request(conn: ipc.FramedStream, msg: ipc.Msg) -> None:
    """Send a client's request, with what cannot be sent as the client's APIError."""
    try:
        await conn.send(msg)
    except ipc.FrameTooLarge:
        raise RequestTooLarge("the request is larger than the engine accepts (MAX_FRAME_BYTES)") from None
    except (OverflowError, RecursionError, ValueError, TypeError, msgspec.EncodeError) as exc:
        # free-form JSON the schemas cannot bound: an integer beyond 64 bits in a tool schema, say
        raise InvalidRequest(f"Invalid request: a value in it cannot be sent to the engine ({exc}); "
                             "integers must fit in 64 bits.") from None


def _check_calls(calls: list[ipc.ToolCall], request_id: str) -> None:
    """Every dialect hands a closed call's arguments to its client as the tool's input: arguments that are not a
    JSON object (the engine returns such a call as text) end the request rather than run the tool with {}."""
    for call in calls:
        if call.partial:  # cut by max_tokens: the text so far, never run
            continue
        try:
            ok = isinstance(json.loads(call.arguments), dict)
        except ValueError:
            ok = False
        if not ok:
            logger.error("%s: the engine sent a call of %r whose arguments are not a JSON object; ending the "
                         "request", request_id, call.name)
            raise GenerationFailed(f"the model called {call.name!r} with arguments that are not a JSON object")


async def _recv(conn: ipc.FramedStream, deadline: float, timeout: float) -> ipc.Msg:
    """One frame before the request's deadline, with transport failures as APIErrors."""
    try:
        with anyio.fail_after(max(0.0, deadline - anyio.current_time())):
            return await conn.recv()
    except TimeoutError:
        raise GenerationTimeout(
            f"the request did not finish within the server's REQUEST_TIMEOUT of {timeout:g} s"
        ) from None
    except ipc.ConnectionClosed:
        raise EngineUnavailable("the engine closed the connection during the request (did it restart?)") from None
    except ipc.FrameError as exc:
        raise GenerationFailed(f"the engine sent a bad frame: {exc}") from None


async def _close(conn: ipc.FramedStream) -> None:
    with anyio.CancelScope(shield=True):
        await conn.aclose()

