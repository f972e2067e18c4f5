"""A client that stops reading mid-stream (its TCP window full) does not slow the other streams.

Two kinds of phase, each with the same batch: an extra streaming request runs alone for FILL_STEPS, then
K measured streams run beside it and end while it still generates. In A the extra's client reads; in B it
reads the first event and stops, so by the time the measured streams start its output has backed up
through the kernel's socket buffers and uvicorn's write buffer into the engine. Once B's client reads again
it gets its whole stream, chunk for chunk what A's client got.

The measured streams' token rates are compared within one run, never against fixed numbers: an A and a B
phase run back to back, and a pair in which B keeps FLOOR of A's rate passes. On a shared machine the rate
of one phase can differ from the next by a third for no reason of ours, so up to PAIRS pairs are run; a
stalled writer that blocked or busied the batch or the gateway would slow B in every pair (or hang it:
every wait is bounded).
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import fcntl
import json
import socket
import statistics
import struct
import termios
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import h11
import httpx

from tests import wire
from tests.harness import wait_for

K = 3  # measured streams beside the extra request
MEASURED_TOKENS = 256
# Every stream asks for 5 top logprobs: about 700 bytes and one chunk a token.
TOP_LOGPROBS = 5
# Steps the extra request runs alone before the measured streams start: in B its backlog has passed the
# kernel's buffers and uvicorn's by then, and fills the engine's socket buffer (after 300 to 450 steps here);
# the rest waits in the request's outbox, so rank 0 holds a writer that cannot write.
FILL_STEPS = 600
# Still generating when the measured streams end, with room for their late start on a busy machine; and
# below what the engine holds for a client that is not reading (OUTPUT_BUFFER_EVENTS, 4096 events), so the
# stalled request stays in the batch whatever the timing.
EXTRA_TOKENS = FILL_STEPS + MEASURED_TOKENS + 700
RCVBUF = 4096
# Loopback's 64 KB segments let the server's send buffer grow to megabytes before the window closes;
# an Ethernet-sized segment keeps it near 100 KB, so the backlog reaches uvicorn and the engine quickly.
MSS = 1460
PAIRS = 4
FLOOR = 0.95  # the measured streams in B keep at least this share of their rate in A
WAIT = 30.0  # seconds any one wait may take
CHAT = "/v1/chat/completions"


def eos_bias(stack) -> dict[str, float]:
    """logit_bias that keeps the model from ending early: every stream runs to its max_tokens."""
    config = json.loads((Path(wire.info(stack.socket).model_path) / "config.json").read_text())
    eos = config.get("eos_token_id")
    return {str(t): -100.0 for t in ([eos] if isinstance(eos, int) else eos or [])}


def chat(content: str, max_tokens: int, bias: dict[str, float], stream: bool = True) -> dict:
    body = {"model": "default", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "logit_bias": bias, "logprobs": True, "top_logprobs": TOP_LOGPROBS}
    return {**body, "stream": True, "stream_options": {"include_usage": True}} if stream else body


def steps(stack) -> int:
    return wire.info(stack.socket).step


def running(stack) -> int:
    info = wire.info(stack.socket)
    return info.active + info.queued


def tokens_at_api(stack) -> int:
    """Generated tokens that have reached the API from the engine since it started."""
    with urllib.request.urlopen(stack.base_url + "/metrics", timeout=10) as r:
        line = next(x for x in r.read().decode().splitlines() if x.startswith("mcs_generation_tokens_total "))
    return int(float(line.split()[1]))


def unsent_by_server(server_port: int, client_port: int) -> int | None:
    """Bytes the API's side of a connection holds because the client's window is closed (None: not Linux)."""
    table = Path("/proc/net/tcp")
    if not table.exists():
        return None
    for row in table.read_text().splitlines()[1:]:
        cols = row.split()
        if int(cols[1].split(":")[1], 16) == server_port and int(cols[2].split(":")[1], 16) == client_port:
            return int(cols[4].split(":")[0], 16)
    return 0


class RawStream:
    """A streaming request on a raw HTTP/1.1 socket with a small receive buffer. It reads the headers and
    the first event, then nothing until `reading` is set (pump() reads from then on)."""

    def __init__(self, port: int, body: dict):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, MSS)
        self.sock.settimeout(WAIT)
        self.sock.connect(("127.0.0.1", port))
        self.port = self.sock.getsockname()[1]
        self.http = h11.Connection(h11.CLIENT)
        self.status = 0
        self.body = bytearray()
        self.ended = self.closed = False
        self.reading = threading.Event()
        data = json.dumps(body).encode()
        head = h11.Request(method="POST", target=CHAT, headers=[
            ("Host", "127.0.0.1"), ("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        self.sock.sendall(b"".join(self.http.send(e) for e in (head, h11.Data(data=data), h11.EndOfMessage())))
        while not self.ended and b"\n\n" not in self.body:  # the headers and the first event
            self.read_some()
        assert self.status == 200, bytes(self.body)

    def read_some(self) -> None:
        """One recv, fed to the HTTP parser."""
        self.http.receive_data(self.sock.recv(65536))
        while (ev := self.http.next_event()) not in (h11.NEED_DATA, h11.PAUSED):
            if isinstance(ev, h11.Response):
                self.status = ev.status_code
            elif isinstance(ev, h11.Data):
                self.body += ev.data
            elif isinstance(ev, h11.EndOfMessage | h11.ConnectionClosed):
                self.ended = True
                return

    def pump(self) -> None:
        """Read once `reading` is set, until the stream ends or close()."""
        while not self.ended and not self.closed:
            if not self.reading.wait(0.05):
                continue
            try:
                self.read_some()
            except (OSError, h11.RemoteProtocolError):
                if not self.closed:
                    raise

    def waiting(self) -> int:
        """Bytes in this socket's receive buffer that the client has not read."""
        return struct.unpack("i", fcntl.ioctl(self.sock, termios.FIONREAD, b"\0\0\0\0"))[0]

    def close(self) -> None:
        self.closed = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a reader blocked in recv
        self.sock.close()


def events(body: bytes) -> list:
    """The SSE data of a stream: dicts, then the final "[DONE]"."""
    out = []
    for frame in body.decode().split("\n\n"):
        if frame:
            assert frame.startswith("data: "), frame[:200]
            data = frame[len("data: "):]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def complete(stream: RawStream) -> list[str]:
    """The extra stream arrived whole (a logprob for every token, its usage, [DONE], no error); its content,
    chunk by chunk."""
    got = events(bytes(stream.body))
    assert stream.ended and got[-1] == "[DONE]", got[-3:]
    chunks = got[:-1]
    assert not [c for c in chunks if "error" in c], [c for c in chunks if "error" in c]
    assert chunks[-1]["usage"]["completion_tokens"] == EXTRA_TOKENS, chunks[-1]
    choices = [c["choices"][0] for c in chunks if c["choices"]]
    assert choices[-1]["finish_reason"] == "length"
    logprobs = [e for c in choices if c["logprobs"] for e in c["logprobs"]["content"]]
    assert len(logprobs) == EXTRA_TOKENS and all(len(e["top_logprobs"]) == TOP_LOGPROBS for e in logprobs)
    return [c["delta"].get("content") or "" for c in choices]


def measured_stream(http: httpx.Client, base_url: str, body: dict) -> float:
    """One measured stream's rate: (completion tokens - 1) / (last content chunk - first content chunk)."""
    times: list[float] = []
    usage = None
    with http.stream("POST", base_url + CHAT, json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[len("data: "):])
            assert "error" not in chunk, chunk
            if chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                times.append(time.monotonic())
            usage = chunk.get("usage") or usage
    assert usage and usage["completion_tokens"] == MEASURED_TOKENS, usage
    return (usage["completion_tokens"] - 1) / (times[-1] - times[0])


@dataclass
class Phase:
    stalled: bool
    rate: float = 0.0  # the measured streams' median
    marks: list[int] = field(default_factory=list)  # the extra request's steps when the measured streams began, ended
    stall: str = ""  # where the stalled stream's output waited
    pieces: list[str] | None = None  # the extra stream's content, when it was read to its end

    def row(self) -> str:
        return (f"{'B stalled' if self.stalled else 'A reading'}  {self.rate:6.1f} tok/s  "
                f"measured during steps {self.marks}  {self.stall}")


def measure(stack, pool: cf.ThreadPoolExecutor, bias: dict[str, float], phase: Phase, step0: int) -> None:
    """phase.rate: the median rate of K measured streams run at once beside the extra request, which must
    outlive them."""
    phase.marks.append(steps(stack) - step0)
    with contextlib.ExitStack() as exits:
        # made first: a client's set-up must not delay its request
        clients = [exits.enter_context(httpx.Client(timeout=WAIT)) for _ in range(K)]
        futures = [pool.submit(measured_stream, http, stack.base_url,
                               chat(f"stream {i}: count sheep", MEASURED_TOKENS, bias))
                   for i, http in enumerate(clients)]
        done, _ = cf.wait(futures, timeout=2 * WAIT)
        assert len(done) == K, f"the measured streams did not end within {2 * WAIT:g} s: {phase.row()}"
        failed = [f.exception() for f in futures if f.exception() is not None]
        assert not failed, f"a measured stream failed: {failed[0]!r}: {phase.row()}"
        phase.rate = statistics.median(f.result() for f in futures)
    phase.marks.append(steps(stack) - step0)
    wait_for(lambda: running(stack) <= 1, WAIT, "the measured streams to leave the batch")
    assert running(stack) == 1, f"the extra request ended before the measured streams: {phase.row()}"


def warm_up(stack, bias: dict[str, float]) -> None:
    """The batch's shapes run once, so the first phase starts no colder than the rest."""
    with httpx.Client(timeout=WAIT) as http, cf.ThreadPoolExecutor(K + 1) as pool:
        bodies = [chat(f"warm up {i}", 32, bias, stream=False) for i in range(K + 1)]
        for r in pool.map(lambda b: http.post(stack.base_url + CHAT, json=b), bodies):
            assert r.status_code == 200, r.text


def run_phase(stack, bias: dict[str, float], stalled: bool, read_to_end: bool) -> Phase:
    """The extra request alone for FILL_STEPS, then the measured streams beside it; with read_to_end its
    stream is then read whole, else closing it cancels the request."""
    wait_for(lambda: running(stack) == 0, WAIT, "an idle engine")
    phase = Phase(stalled)
    with contextlib.ExitStack() as exits:
        pool = exits.enter_context(cf.ThreadPoolExecutor(K + 1))
        step0, at_api0 = steps(stack), tokens_at_api(stack)
        extra = RawStream(stack.api_port, chat("tell me a long story", EXTRA_TOKENS, bias))
        exits.callback(extra.close)  # first out: ends the extra request and frees its reader
        if not stalled:
            extra.reading.set()
        pump = pool.submit(extra.pump)
        wait_for(lambda: steps(stack) - step0 >= FILL_STEPS, WAIT, f"the extra request's first {FILL_STEPS} steps")
        if stalled:
            # The stall is real: the client's buffer is full, the API's socket holds what the client's window
            # refuses, and much of what the engine generated has not even reached the API.
            held, unsent = extra.waiting(), unsent_by_server(stack.api_port, extra.port)
            at_api, generated = tokens_at_api(stack) - at_api0, steps(stack) - step0
            phase.stall = (f"client buffer {held} B, API socket unsent {unsent} B, "
                           f"tokens that reached the API {at_api} of {generated}")
            assert held >= RCVBUF // 2, phase.row()
            assert unsent is None or unsent > 0, phase.row()
            assert generated - at_api >= FILL_STEPS // 2, phase.row()
        measure(stack, pool, bias, phase, step0)
        if stalled:
            assert unsent_by_server(stack.api_port, extra.port) != 0, f"the window opened: {phase.row()}"
        if read_to_end:
            extra.reading.set()
            wait_for(lambda: extra.ended or pump.done(), WAIT, "the extra stream to end")
            pump.result()
            phase.pieces = complete(extra)
    return phase


def test_a_client_that_stops_reading_does_not_slow_the_other_streams(stack):
    bias = eos_bias(stack)
    warm_up(stack, bias)
    pairs: list[tuple[Phase, Phase]] = []  # (A, B), run back to back
    for number in range(PAIRS):
        # A then B, then B then A, ...: neither side always runs second. The first pair reads both extra
        # streams to their end; later ones only measure.
        order = (False, True) if number % 2 == 0 else (True, False)
        ran = {stalled: run_phase(stack, bias, stalled, read_to_end=number == 0) for stalled in order}
        pairs.append((ran[False], ran[True]))
        if ran[True].rate >= FLOOR * ran[False].rate:
            break
    table = "\n".join(f"{a.row()}\n{b.row()}\n  B/A {b.rate / a.rate:.3f}" for a, b in pairs)
    print("\n" + table)
    assert any(b.rate >= FLOOR * a.rate for a, b in pairs), f"the stalled reader slowed the other streams:\n{table}"
    # Nothing the stalled client missed was lost or changed: the reading client's chunks, one for one.
    first_a, first_b = pairs[0]
    assert first_b.pieces == first_a.pieces
    # The extra requests cancelled by closing their connection left the batch; a plain request is served.
    wait_for(lambda: running(stack) == 0, WAIT, "an idle engine")
    with httpx.Client(timeout=WAIT) as http:
        r = http.post(stack.base_url + CHAT, json=chat("hello", 5, bias, stream=False))
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
