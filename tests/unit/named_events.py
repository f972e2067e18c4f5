"""Helpers for the API tests of dialects whose streams name their events (Anthropic's, Responses)."""

from __future__ import annotations

import json

import anyio
import msgspec

import ipc


def events_of(text: str) -> list[tuple[str, dict]]:
    """(event name, data) of each SSE frame."""
    out = []
    for frame in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def play(engine, *events: ipc.Delta | ipc.Finish) -> None:
    """Script the fake engine: Started (7 prompt tokens), then these events under the request's id."""

    async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        await conn.send(ipc.Started(request_id=msg.request_id, prompt_tokens=7))
        for ev in events:
            await conn.send(msgspec.structs.replace(ev, request_id=msg.request_id))

    engine.script = script


def slow_prefill(engine, seconds: float) -> None:
    """Script the fake engine: Started, the Delta of joining the batch, then nothing for `seconds` (a long
    prefill), then one token's Finish."""

    async def script(conn: ipc.FramedStream, msg: ipc.Generate) -> None:
        await conn.send(ipc.Started(request_id=msg.request_id, prompt_tokens=7))
        await conn.send(ipc.Delta(request_id=msg.request_id, text="", completion_tokens=0))
        await anyio.sleep(seconds)
        await conn.send(ipc.Finish(request_id=msg.request_id, finish_reason="stop", prompt_tokens=7,
                                   completion_tokens=1, text="ok"))

    engine.script = script
