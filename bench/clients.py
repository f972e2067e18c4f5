"""Async HTTP load generator: streaming OpenAI requests over SSE, timed per chunk.

Generated tokens are counted from the final `usage` (requested with
`stream_options.include_usage`, which both our API and mlx_lm.server honour), never from the
number of chunks. Time to first token is the arrival of the first chunk with non-empty text.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

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


async def stream_one(client: httpx.AsyncClient, base_url: str, req: Request) -> Sample:
    s = Sample(sent=time.perf_counter())
    while True:
        try:
            await _stream(client, base_url, req, s)
            break
        except (httpx.HTTPError, OSError) as exc:
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


async def _stream(client: httpx.AsyncClient, base_url: str, req: Request, s: Sample) -> None:
    async with client.stream("POST", base_url + req.path, json=req.body) as r:
        s.status = r.status_code
        if r.status_code != 200:
            s.error = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
            return
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            obj = json.loads(payload)
            now = time.perf_counter()
            if "error" in obj:
                s.error = str(obj["error"])[:200]
                break
            s.chunks += 1
            if _text(obj):
                s.first = s.first if s.first is not None else now
                s.last = now
            usage = obj.get("usage")
            if usage:
                s.tokens = int(usage.get("completion_tokens") or 0)


def _client(concurrency: int, timeout: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    return httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout, connect=10.0))


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

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            result.samples.append(await stream_one(client, base_url, req))

    async with _client(concurrency, timeout) as client:
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

    async def worker(client: httpx.AsyncClient) -> None:
        while not stop.is_set():
            samples.append(await stream_one(client, base_url, make()))

    async with _client(concurrency, timeout) as client:
        await asyncio.wait_for(asyncio.gather(*(worker(client) for _ in range(concurrency))), timeout)
    return samples


def steady(base_url: str, make: Callable[[], Request], concurrency: int, stop: threading.Event,
           timeout: float = 3600.0) -> list[Sample]:
    """Closed loop until stop is set: `concurrency` workers each send make()'s next request as soon as their
    previous one ended (the requests under way when stop is set still run to their end)."""
    return asyncio.run(_steady(base_url, make, concurrency, stop, timeout))


async def _waves(base_url: str, waves: list[tuple[float, list[Request]]], timeout: float) -> list[list[Sample]]:
    async with _client(sum(len(w) for _, w in waves), timeout) as client:
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
