"""Rank 0's socket: handshaken connections, tokenisation and admission, events back to clients.

It runs an anyio event loop in its own thread; the step loop (main thread) receives
submissions through a thread-safe queue and hands back each step's events in one call.
While a client keeps up, the step thread writes its events straight to its socket (see Outbox):
a token costs one non-blocking write, not a wake of this thread.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable
from typing import Any

import anyio
from anyio.abc import SocketAttribute

from config import Settings
from engine.rank0 import errors, validate
from engine.rank0.admission import Prompter
from engine.rank0.errors import Refused, invalid_request
from engine.rank0.helper_desk import HelperDesk
from engine.rank0.lanes import TokenizerLanes
from engine.rank0.loop_thread import LoopThread
from engine.rank0.outbox import DONE, Outbox
from engine.rank0.peer import send_answer, watch_peer
from engine.rank0.peer import send_quietly as _send
from engine.rank0.requests import Counters, Submit, Withdraw
from ipc import (
    ConnectionClosed,
    Detokenize,
    Embed,
    FrameError,
    FramedStream,
    FrameTooLarge,
    Generate,
    Info,
    InfoRequest,
    Msg,
    Rerank,
    Started,
    Tokenize,
    TruncatedFrame,
    serve_unix,
)
from ipc.connection import HANDSHAKE_TIMEOUT

log = logging.getLogger(__name__)

# With several ranks, a step whose events go to more connections than this hands them all to the event loop
# instead, as before the step thread wrote to sockets: the other ranks wait for rank 0 in a spinning collective,
# and on 2 local ranks (2 cores), engines with and without direct writes taking turns gave ratios from 0.74 to
# 1.14 from one run to the next. One rank writes every connection directly: 9-11 % faster at 1 and 8 streams.
MULTIRANK_DIRECT_CONNECTIONS = 0
FLUSH_SECONDS = 1.0  # at stop, how long open generations get to receive their last event


class EngineServer(LoopThread):
    """Serves the Unix socket from a background thread on behalf of the step loop."""

    def __init__(self, settings: Settings, prompter: Prompter, counters: Counters,
                 inbound: queue.SimpleQueue, info: Callable[[], Info], desk: HelperDesk | None = None):
        super().__init__("engine-socket")
        self.settings = settings
        self.desk = desk if desk is not None else HelperDesk({}, inbound, settings.HELPER_MAX_INPUTS,
                                                             settings.REQUEST_TIMEOUT)
        self.prompter = prompter
        self.counters = counters
        self.inbound = inbound
        self.info = info
        self.direct_limit: int | None = None  # connections a step's events are written to directly (None: all)
        self.accepting = True
        self._live: set[str] = set()  # request ids with an open generation; touched on the event loop only
        self._lanes: TokenizerLanes | None = None  # made on the event loop

    def post(self, events: list) -> None:
        """Step thread: deliver one step's events, one write per generation; what cannot be written now
        takes one hop onto the event loop."""
        if not events or self._loop is None:
            return
        by_outbox: dict[Outbox, list] = {}
        for outbox, msg in events:
            by_outbox.setdefault(outbox, []).append(msg)
        queued: list = []
        direct = self.direct_limit is None or len(by_outbox) <= self.direct_limit
        for outbox, msgs in by_outbox.items():
            outbox.deliver(msgs, queued, direct)
        if queued:
            self._loop.call_soon_threadsafe(_dispatch, queued)

    async def serve(self) -> None:
        """The event loop's work (engine/rank0/loop_thread.py: start and stop come from the step thread)."""
        self._lanes = TokenizerLanes()
        async with anyio.create_task_group() as tg:
            await tg.start(lambda task_status: serve_unix(
                self.settings.socket_path, self._handle, max_frame=self.settings.MAX_FRAME_BYTES,
                task_status=task_status))
            self._ready.set()
            await self._stop.wait()
            # The step loop's last events (a drain's shutting_down errors) reach their clients first.
            with anyio.move_on_after(FLUSH_SECONDS):
                while self._live:
                    await anyio.sleep(0.01)
            tg.cancel_scope.cancel()
        try:
            os.unlink(self.settings.socket_path)
        except FileNotFoundError:
            pass

    # -- connections -------------------------------------------------------------------
    async def _handle(self, conn: FramedStream) -> None:
        try:
            # A client that handshakes and then sends nothing (or half a frame) is let go.
            with anyio.fail_after(HANDSHAKE_TIMEOUT):
                msg = await conn.recv()
        except (FrameError, TruncatedFrame, TimeoutError) as exc:
            await _send(conn, invalid_request(str(exc) or f"no complete request within {HANDSHAKE_TIMEOUT:g} s",
                                              code="bad_frame"))
            return
        except ConnectionClosed:
            return
        if isinstance(msg, InfoRequest):
            await _send(conn, self.info())
        elif isinstance(msg, Generate):
            await self._generate(conn, msg)
        elif isinstance(msg, Tokenize):
            param = "messages" if msg.kind == "chat" else "prompt"
            await self._tokenizer_work(conn, self.prompter.tokenize, msg, param)
        elif isinstance(msg, Detokenize):
            await self._tokenizer_work(conn, self.prompter.detokenize, msg, "tokens")
        elif isinstance(msg, Embed | Rerank):
            await self._helper_work(conn, msg)
        else:
            await _send(conn, invalid_request(f"unexpected {type(msg).__name__.lower()} message; send info, "
                                              "generate, tokenize, detokenize, embed or rerank", code="bad_frame"))

    async def _helper_work(self, conn: FramedStream, msg: Embed | Rerank) -> None:
        """An Embed or Rerank, answered by the helper models between steps (engine/rank0/helper_desk.py)."""
        rid = msg.request_id
        if not self.accepting:
            await _send(conn, errors.shutting_down(rid, "the engine is shutting down; retry shortly"))
            return
        try:
            frames = await self.desk.answer(conn, msg, self._lanes, watch_peer)
        except Exception:  # a bug, not the client's fault: answer it, keep serving everyone else
            log.exception("%s %s failed", type(msg).__name__.lower(), rid)
            frames = [errors.generation_failed(rid, "the engine failed this request (see the engine log); other "
                                                    "requests are unaffected")]
        await send_answer(conn, frames, rid)

    async def _tokenizer_work(self, conn: FramedStream, work: Callable[[Any], Msg], msg: Msg, param: str) -> None:
        """Answer a Tokenize or Detokenize from a worker thread; the plan and the other ranks never see it.
        A client that leaves while its request waits for a worker takes the request with it."""
        name = type(msg).__name__.lower()
        size = conn.last_frame_bytes
        reply: Msg | None = None
        complaint: list[Msg] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(watch_peer, conn, "", tg.cancel_scope, complaint)
            try:
                reply = await self._lanes.run(work, msg, size)
            except Refused as exc:
                reply = exc.error
            except Exception:  # a bug, not the client's fault: answer it, keep serving everyone else
                log.exception("%s failed", name)
                reply = errors.generation_failed("", f"the engine failed to {name} this request (see the engine log)")
            tg.cancel_scope.cancel()
        if complaint:
            reply = complaint[0]
        if reply is None:
            return
        try:
            await conn.send(reply)
        except FrameTooLarge:
            hint = " or leave out return_token_strs" if getattr(msg, "return_token_strs", False) else ""
            await _send(conn, invalid_request(f"the answer is larger than the engine's socket allows "
                                              f"(MAX_FRAME_BYTES={conn.max_frame}); send a shorter input{hint}", param))
        except ConnectionClosed:
            pass

    async def _generate(self, conn: FramedStream, gen: Generate) -> None:
        rid = gen.request_id
        if not self.accepting:
            await _send(conn, errors.shutting_down(rid, "the engine is shutting down; retry shortly"))
            return
        try:
            gen = validate.check(gen, self.prompter.limits)
        except Refused as exc:
            await _send(conn, exc.to(rid))
            return
        if rid in self._live:
            await _send(conn, invalid_request(f"request_id {rid!r} is already generating; use a unique id",
                                              "request_id", request_id=rid))
            return
        self._live.add(rid)
        try:
            await self._admit_and_stream(conn, gen)
        except Exception:  # a bug, not the client's fault: answer it, keep serving everyone else
            log.exception("request %s failed", rid)
            await _send(conn, errors.generation_failed(rid, "the engine failed this request (see the engine log); "
                                                            "other requests are unaffected"))
        finally:
            self._live.discard(rid)

    async def _admit_and_stream(self, conn: FramedStream, gen: Generate) -> None:
        rid = gen.request_id
        complaint: list[Msg] = []  # why the request ends early, for its client
        tokens = await self._prompt_tokens(conn, gen)
        if tokens is None:
            return
        # Bounded: a client that stops reading must not make rank 0 hold its tokens without limit.
        send, receive = anyio.create_memory_object_stream(self.settings.OUTPUT_BUFFER_EVENTS)
        outbox = Outbox(send, conn.max_frame)
        deadline = time.monotonic() + self.settings.REQUEST_TIMEOUT
        try:
            # Grammars compile here, off the event loop (the first one also builds llguidance's tokenizer).
            requests = await anyio.to_thread.run_sync(self.prompter.admission.requests, gen, tokens, outbox, deadline)
        except Refused as exc:
            send.close()
            await _send(conn, exc.to(rid))
            return
        if not self.counters.admit(len(requests), self.settings.MAX_BATCH + self.settings.MAX_QUEUE):
            send.close()
            await _send(conn, errors.queue_full(rid, self.settings.MAX_BATCH, self.settings.MAX_QUEUE))
            return
        try:
            # Started goes first: from Submit on, the step thread may write to this socket.
            await conn.send(Started(request_id=rid, prompt_tokens=len(tokens)))
        except ConnectionClosed:
            send.close()
            self.counters.unadmit(len(requests))
            return
        outbox.open(conn.stream.extra(SocketAttribute.raw_socket, None), len(requests))
        self.inbound.put(Submit(requests))
        finished = False
        try:
            async with anyio.create_task_group() as tg:
                outbox.scope = tg.cancel_scope
                tg.start_soon(watch_peer, conn, rid, tg.cancel_scope, complaint)
                finished = await self._relay(conn, receive, outbox, rid, complaint)
                tg.cancel_scope.cancel()
        except ConnectionClosed:
            pass
        except Exception:  # a bug, not the client's fault: answer it (after the frame in flight), serve on
            log.exception("request %s failed while streaming", rid)
            complaint.append(errors.generation_failed(rid, "the engine failed this request (see the engine log); "
                                                           "other requests are unaffected"))
        finally:
            outbox.close()  # before the connection closes: the step thread must never write to a reused fd
            send.close()
            if not finished:
                self.inbound.put(Withdraw(rid))
        if outbox.overflowed:
            log.warning("request %s: the client stopped reading (%d events waiting); cancelled", rid,
                        self.settings.OUTPUT_BUFFER_EVENTS)
            complaint.insert(0, errors.client_not_reading(rid, self.settings.OUTPUT_BUFFER_EVENTS))
        if complaint:
            await _complain(conn, outbox, complaint[0])

    async def _prompt_tokens(self, conn: FramedStream, gen: Generate) -> list[int] | None:
        """The prompt's tokens, or None when the client was answered already (refused, too long) or left."""
        rid = gen.request_id
        tokens: list[int] | None = None
        complaint: list[Msg] = []
        async with anyio.create_task_group() as tg:
            # A client that leaves while its prompt waits for a tokenizer slot takes it out of the queue.
            tg.start_soon(watch_peer, conn, rid, tg.cancel_scope, complaint)
            try:
                tokens = await self._lanes.run(self.prompter.tokens, gen, conn.last_frame_bytes)
            except Refused as exc:
                complaint.append(exc.to(rid))
            tg.cancel_scope.cancel()
        if complaint or tokens is None:
            if complaint:
                await _send(conn, complaint[0])
            return None
        ctx = self.prompter.context_length
        if len(tokens) >= ctx:
            await _send(conn, invalid_request(
                f"This model's maximum context length is {ctx} tokens, but the prompt has {len(tokens)} tokens; "
                "shorten the prompt", "messages" if gen.kind == "chat" else "prompt", "context_length_exceeded", rid))
            return None
        return tokens

    async def _relay(self, conn: FramedStream, receive, outbox: Outbox, rid: str, complaint: list[Msg]) -> bool:
        """Forward what the step thread could not write itself, until the request's end (DONE), giving the
        socket back to the step thread whenever it has caught up; False if the client left first, or an event
        was too large to send (complaint then says so)."""
        async with receive:
            async for item in receive:
                if item is DONE:
                    return True
                try:
                    if isinstance(item, bytes):
                        await conn.send_bytes(item)
                        outbox.tail = b""
                    else:
                        await conn.send(item)
                except ConnectionClosed:
                    return False
                except FrameTooLarge as exc:  # nothing of it was sent
                    complaint.append(invalid_request(
                        f"a piece of this request's output is larger than the engine's socket allows ({exc}; "
                        "MAX_FRAME_BYTES): raise MAX_FRAME_BYTES, or ask for less at once (echo, logprobs)",
                        code="output_too_large", request_id=rid))
                    return False
                outbox.resume()
        return False


def _dispatch(events: list) -> None:
    for outbox, msg in events:
        outbox.put(msg)


async def _complain(conn: FramedStream, outbox: Outbox, message: Msg) -> None:
    """A request's error to its client, within a second; the rest of a frame a write left half sent goes first,
    or the client could not read the error."""
    with anyio.move_on_after(1.0, shield=True):
        rest = conn.unsent or outbox.tail
        try:
            if rest:
                await conn.send_bytes(bytes(rest))
            await conn.send(message)
        except ConnectionClosed:
            pass

