"""Async HTTP load generator: streaming OpenAI requests over SSE, timed per chunk.

Generated tokens are counted from the final `usage` (requested with
`stream_options.include_usage`, which both our API and mlx_lm.server honour), never from the
number of chunks. Time to first token is the arrival of the first chunk with non-empty text.

The HTTP/1.1 client is a few lines on asyncio streams, one connection per request, not httpx: on a
2-core machine the load generator shares the cores with the server it measures, and httpx's per-event
work (~0.65 ms of CPU per streamed token here, about what our whole API spends) came out of the
server's time, and the in-process ceilings pay nothing like it.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# mlx_lm.server loads a model named by `model` unless it is absent; our API requires the field.
OMIT = None


@dataclass
class Sample:
    """One streamed request as the client saw it (times from time.perf_counter())."""

    sent: float
    done: float = 0.0
    first: float | None = None
    last: float | None = None
    tokens: int = 0
    chunks: int = 0
    error: str = ""
    status: int | None = None
    retries: int = 0

    @property
    def ok(self) -> bool:
        return not self.error and self.first is not None

    @property
    def ttft(self) -> float:
        return (self.first - self.sent) if self.first is not None else math.nan

    @property
    def decode_tps(self) -> float:
        """Tokens after the first one over the time between first and last text chunk."""
        if self.first is None or self.last is None or self.last <= self.first or self.tokens < 2:
            return math.nan
        return (self.tokens - 1) / (self.last - self.first)

    @property
    def e2e_tps(self) -> float:
        return self.tokens / (self.done - self.sent) if self.done > self.sent else math.nan


@dataclass
class Request:
    path: str  # /v1/chat/completions or /v1/completions
    body: dict


def chat(content: str, max_tokens: int, logit_bias: dict[int, float], model: str | None) -> Request:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True},
            "logit_bias": {str(k): v for k, v in logit_bias.items()}}
    if model is not None:
        body["model"] = model
    return Request("/v1/chat/completions", body)


def completion(tokens: list[int], max_tokens: int, logit_bias: dict[int, float], model: str | None) -> Request:
    body = {"prompt": tokens, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "logit_bias": {str(k): v for k, v in logit_bias.items()}}
    if model is not None:
        body["model"] = model
    return Request("/v1/completions", body)


def _text(obj: dict) -> str:
    out = ""
    for choice in obj.get("choices") or ():
        delta = choice.get("delta")
        out += (delta.get("content") or "") if delta is not None else (choice.get("text") or "")
    return out


# Like the openai SDK's default: a request that fails before any response arrives (refused or
# reset connection; mlx_lm.server listens with a backlog of 5) is sent again, at most twice.
RETRIES = 2


class ResponseError(Exception):
    """The server closed the connection early or sent something that is not HTTP/1.x."""


async def stream_one(client: Client, base_url: str, req: Request) -> Sample:
    s = Sample(sent=time.perf_counter())
    while True:
        try:
            await _stream(client, base_url, req, s)
            break
        except (ResponseError, OSError, asyncio.IncompleteReadError, asyncio.TimeoutError) as exc:
            if s.status is None and s.retries < RETRIES:
                s.retries += 1
                continue
            s.error = f"{type(exc).__name__}: {exc!r}"[:200]
            break
        except ValueError as exc:
            s.error = f"{type(exc).__name__}: {exc}"[:200]
            break
    s.done = time.perf_counter()
    if not s.error and s.tokens == 0:
        s.error = "no usage in the stream"
    return s


async def _stream(client: Client, base_url: str, req: Request, s: Sample) -> None:
    url = urlsplit(base_url + req.path)
    body = json.dumps(req.body).encode()
    reader, writer = await asyncio.wait_for(asyncio.open_connection(url.hostname, url.port or 80),
                                            client.connect_timeout)
    try:
        writer.write(f"POST {url.path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
                     f"Accept: text/event-stream\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                     .encode() + body)
        await writer.drain()
        status, headers = await _head(reader)
        s.status = status
        if status != 200:
            text = b"".join([piece async for piece in _body(reader, headers)])
            s.error = f"HTTP {status}: {text[:200]!r}"
            return
        rest = b""
        async for piece in _body(reader, headers):
            now = time.perf_counter()
            *lines, rest = (rest + piece).split(b"\n")
            for line in lines:
                if not line.startswith(b"data:"):
                    continue
                payload = line[5:].strip()
                if payload == b"[DONE]":
                    return
                obj = json.loads(payload)
                if "error" in obj:
                    s.error = str(obj["error"])[:200]
                    return
                s.chunks += 1
                if _text(obj):
                    s.first = s.first if s.first is not None else now
                    s.last = now
                usage = obj.get("usage")
                if usage:
                    s.tokens = int(usage.get("completion_tokens") or 0)
    finally:
        writer.close()


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[bytes, bytes]]:
    """The status code and the headers (names lower-cased) of a response."""
    parts = (await reader.readline()).split(None, 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ResponseError(f"not an HTTP/1.x status line: {b' '.join(parts)[:80]!r}")
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b"\n"):
        if not line:
            raise ResponseError("the connection closed inside the response headers")
        name, _, value = line.partition(b":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers


async def _body(reader: asyncio.StreamReader, headers: dict[bytes, bytes]):
    """A response body's bytes as they arrive: chunked, of a Content-Length, or up to the close."""
    if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
        while True:
            line = await reader.readline()
            if not line.endswith(b"\n"):
                raise ResponseError("the connection closed inside a chunked body")
            size = int(line.split(b";")[0].strip(), 16)
            if size == 0:
                return
            data = await reader.readexactly(size + 2)  # the chunk and its CRLF
            yield data[:-2]
    elif b"content-length" in headers:
        yield await reader.readexactly(int(headers[b"content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


@dataclass
class Client:
    """What every request of a run shares: only the connect timeout (each request has a connection of its own)."""

    connect_timeout: float = 10.0


@dataclass
class LoadResult:
    concurrency: int
    samples: list[Sample] = field(default_factory=list)
    wall: float = 0.0
    other_load: float = math.nan  # cores other people's processes used meanwhile
    quiet_wait: float = 0.0
    server_cpu: float = math.nan  # CPU seconds all the server's processes used meanwhile
    server_cpu_by_process: dict = field(default_factory=dict)

    @property
    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    @property
    def errors(self) -> list[str]:
        return [s.error or "no text" for s in self.samples if not s.ok]

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.ok)

    @property
    def aggregate_tps(self) -> float:
        return self.tokens / self.wall if self.wall > 0 else math.nan

    def summary(self) -> dict:
        ttft = [s.ttft for s in self.ok]
        return {
            "concurrency": self.concurrency, "requests": len(self.samples), "errors": len(self.errors),
            "first_errors": self.errors[:3], "retries": sum(x.retries for x in self.samples),
            "tokens": self.tokens, "wall_s": self.wall,
            "aggregate_tps": self.aggregate_tps,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
            "decode_tps_p50": percentile([s.decode_tps for s in self.ok], 50),
            "e2e_tps_p50": percentile([s.e2e_tps for s in self.ok], 50),
            "other_load_cores": self.other_load, "server_cpu_s": self.server_cpu,
        }


def combine(runs: list[LoadResult]) -> dict:
    """Several runs at one concurrency: best and median throughput, TTFT pooled over all requests.

    Other people's processes only ever slow a run down, so the best run is the least noisy
    estimate of what the server can do; the median is kept next to it.
    """
    samples = [x for r in runs for x in r.ok]
    ttft = [x.ttft for x in samples]
    tps = [r.aggregate_tps for r in runs]
    return {
        "concurrency": runs[0].concurrency, "runs": [r.summary() for r in runs],
        "requests": sum(len(r.samples) for r in runs), "errors": sum(len(r.errors) for r in runs),
        "first_errors": [e for r in runs for e in r.errors][:3],
        "retries": sum(x.retries for r in runs for x in r.samples),
        "aggregate_tps": max(tps), "aggregate_tps_median": percentile(tps, 50),
        "ttft_p50_s": percentile(ttft, 50), "ttft_p90_s": percentile(ttft, 90),
        "decode_tps_best": max((x.decode_tps for x in samples), default=math.nan),
        "decode_tps_p50": percentile([x.decode_tps for x in samples], 50),
        "e2e_tps_p50": percentile([x.e2e_tps for x in samples], 50),
        # The load during the run the throughput comes from, and the worst of all runs.
        "other_load_cores": max(runs, key=lambda r: r.aggregate_tps).other_load,
        "other_load_max": max((r.other_load for r in runs), default=math.nan),
        # CPU the server burnt per generated token: unlike tokens/s, hardly moved by other processes.
        "server_cpu_ms_per_token": 1000 * sum(r.server_cpu for r in runs) / max(1, sum(r.tokens for r in runs)),
        "server_cpu_ms_per_token_by_process": {
            name: 1000 * sum(r.server_cpu_by_process.get(name, 0.0) for r in runs) / max(1, sum(r.tokens for r in runs))
            for name in runs[0].server_cpu_by_process},
        "quiet_wait_s": sum(r.quiet_wait for r in runs),
    }


async def _load(base_url: str, requests: list[Request], concurrency: int, timeout: float) -> LoadResult:
    queue: asyncio.Queue[Request] = asyncio.Queue()
    for r in requests:
        queue.put_nowait(r)
    result = LoadResult(concurrency)

    async def worker(client: Client) -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result.samples.append(await stream_one(client, base_url, req))

    client = Client()
    t0 = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(concurrency))), timeout)
    result.wall = time.perf_counter() - t0
    return result


def load(base_url: str, requests: list[Request], concurrency: int, timeout: float = 600.0) -> LoadResult:
    """Closed loop: `concurrency` workers send the requests, each as soon as its previous one ended."""
    return asyncio.run(_load(base_url, requests, concurrency, timeout))


async def _steady(base_url: str, make: Callable[[], Request], concurrency: int, stop: threading.Event,
                  timeout: float) -> list[Sample]:
    samples: list[Sample] = []

    async def worker(client: Client) -> None:
        while not stop.is_set():
            samples.append(await stream_one(client, base_url, make()))

    client = Client()
    await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(concurrency))), timeout)
    return samples


def steady(base_url: str, make: Callable[[], Request], concurrency: int, stop: threading.Event,
           timeout: float = 3600.0) -> list[Sample]:
    """Closed loop until stop is set: `concurrency` workers each send make()'s next request as soon as their
    previous one ended (the requests under way when stop is set still run to their end)."""
    return asyncio.run(_steady(base_url, make, concurrency, stop, timeout))


async def _waves(base_url: str, waves: list[tuple[float, list[Request]]], timeout: float) -> list[list[Sample]]:
    client = Client()
    t0 = time.perf_counter()

    async def wave(delay: float, reqs: list[Request]) -> list[Sample]:
        await asyncio.sleep(max(0.0, t0 + delay - time.perf_counter()))
        return list(await asyncio.gather(*(stream_one(client, base_url, r) for r in reqs)))

    return list(await asyncio.wait_for(asyncio.gather(*(wave(d, r) for d, r in waves)), timeout))


def waves(base_url: str, waves: list[tuple[float, list[Request]]], timeout: float = 600.0) -> list[list[Sample]]:
    """Open loop: each wave's requests are all sent at its offset (seconds after the start)."""
    return asyncio.run(_waves(base_url, waves, timeout))


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks; nan for an empty list."""
    xs = sorted(v for v in values if not math.isnan(v))
    if not xs:
        return math.nan
    k = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)
