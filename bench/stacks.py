"""py-spy's output read back: raw collapsed stacks into categories and leaf functions, `dump` into thread names.

A raw profile (`py-spy record --threads -f raw`) has one line per distinct stack:
`thread (TID): NAME;outermost (file.py:12);...;innermost (file.py:34) COUNT`. Each sample of a thread
goes to the first category (in the order given) one of whose rules matches any frame of its stack:
inclusive, so a category holds everything called below its functions, and the order settles overlaps
(the forward step before the step's own bookkeeping, the engine socket's reads before the event loop).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

OTHER = "other"
_THREAD = re.compile(r"^thread \((?P<tid>\w+)\)(?::\s*(?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")
_DUMP_THREAD = re.compile(r'^Thread (?P<tid>\w+) \((?P<state>[^)]*)\)(?::\s*"(?P<name>.*)")?')


@dataclass(frozen=True)
class Frame:
    function: str  # qualified when py-spy knows the class: `BatchGenerator.next`
    file: str  # as py-spy shortens it: `mlx_lm/generate.py`, `<frozen runpy>`


@dataclass(frozen=True)
class Stack:
    tid: int
    thread: str
    frames: tuple[Frame, ...]  # outermost first
    count: int


@dataclass(frozen=True)
class Rule:
    """A category and the frames that put a sample in it."""

    category: str
    functions: tuple[str, ...] = ()  # exact names, or prefixes when they end with "." (`PlanChannel.`)
    files: str = ""  # a regular expression a frame's file must match (search), when set
    waiting: bool = False  # the thread waits for something to do here: left out of the leaf table

    def matches(self, frame: Frame) -> bool:
        for f in self.functions:
            if frame.function == f or (f.endswith(".") and frame.function.startswith(f)):
                return True
        return bool(self.files) and re.search(self.files, frame.file) is not None


def _tid(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def frame(text: str) -> Frame:
    m = _FRAME.match(text.strip())
    if m is None:
        return Frame(text.strip(), "")
    return Frame(m["function"], m["file"])


def parse_raw(text: str) -> list[Stack]:
    """Every stack of a raw profile; lines that are not `stack count` are skipped."""
    out = []
    for line in text.splitlines():
        head, _, count = line.rstrip().rpartition(" ")
        if not head or not count.isdigit():
            continue
        parts = head.split(";")
        m = _THREAD.match(parts[0])
        if m is None:  # recorded without --threads
            out.append(Stack(0, "all threads", tuple(frame(p) for p in parts), int(count)))
            continue
        out.append(Stack(_tid(m["tid"]), m["name"] or f"thread {m['tid']}", tuple(frame(p) for p in parts[1:]),
                         int(count)))
    return out


def categorise(stack: Stack, rules: list[Rule]) -> Rule | None:
    """The first rule matching any frame of the stack (None: other)."""
    for rule in rules:
        if any(rule.matches(f) for f in stack.frames):
            return rule
    return None


def shares(stacks: list[Stack], rules_for) -> dict[str, dict]:
    """Per thread name (threads of one name pooled): samples, threads, and samples by category in rule order
    (other last). rules_for(thread name) gives that thread's rules."""
    by_thread: dict[str, list[Stack]] = defaultdict(list)
    for s in stacks:
        by_thread[s.thread].append(s)
    out = {}
    for name, group in by_thread.items():
        rules = rules_for(name)
        counts: Counter[str] = Counter()
        for s in group:
            rule = categorise(s, rules)
            counts[rule.category if rule else OTHER] += s.count
        ordered = {r.category: counts[r.category] for r in rules if counts[r.category]}
        if counts[OTHER]:
            ordered[OTHER] = counts[OTHER]
        out[name] = {"samples": sum(counts.values()), "threads": len({s.tid for s in group}),
                     "waiting": [r.category for r in rules if r.waiting], "categories": ordered}
    return out


def top_leaves(stacks: list[Stack], rules_for, n: int = 15) -> list[tuple[str, str, int]]:
    """The n commonest innermost frames (function (file), thread name, samples), samples in waiting categories
    left out: where the threads run, not where they wait."""
    counts: Counter[tuple[str, str]] = Counter()
    for s in stacks:
        rule = categorise(s, rules_for(s.thread))
        if (rule is not None and rule.waiting) or not s.frames:
            continue
        leaf = s.frames[-1]
        counts[(f"{leaf.function} ({leaf.file})" if leaf.file else leaf.function, s.thread)] += s.count
    return [(leaf, thread, k) for (leaf, thread), k in counts.most_common(n)]


def dump_threads(text: str) -> dict[int, tuple[str, str]]:
    """`py-spy dump` output: tid -> (thread name, state such as `idle` or `active+gil`)."""
    out = {}
    for line in text.splitlines():
        m = _DUMP_THREAD.match(line.strip())
        if m is not None:
            out[_tid(m["tid"])] = (m["name"] or "", m["state"])
    return out


# -- our processes' threads ------------------------------------------------------------------------

_WAITS = ("EpollSelector.select", "PollSelector.select", "SelectSelector.select", "KqueueSelector.select",
          "Condition.wait", "Event.wait", "Queue.get", "Thread.join", "sleep")
WAITING = Rule("waiting (selector, queue, condition, sleep)", functions=_WAITS, waiting=True)

ENGINE_MAIN = [
    Rule("forward step (mlx-lm BatchGenerator.next)",
         functions=("BatchGenerator.next", "BatchGenerator._next", "BatchGenerator.next_generated")),
    Rule("plan broadcast / meeting (PlanChannel, all_sum, doorbell)",
         functions=("PlanChannel.", "Leader._broadcast", "Leader._post", "Leader._collect", "Doorbell.")),
    Rule("scheduler output work (Scheduler.absorb and below)", functions=("Scheduler.absorb",)),
    Rule("apply plan (LockstepBatch.apply)", functions=("LockstepBatch.apply",)),
    Rule("writing events to client sockets (EngineServer.post)", functions=("EngineServer.post",)),
    Rule("plan making (Leader._next_plan)", functions=("Leader._next_plan",)),
    Rule("waiting for requests (Leader._drain_inbound)", functions=("Leader._drain_inbound",), waiting=True),
    Rule("waiting for rank 0 (follower's doorbell)", functions=("StepLoop._sleep", "Bell."), waiting=True),
    Rule("step bookkeeping (LockstepBatch.step outside BatchGenerator.next)", functions=("LockstepBatch.step",)),
]
ENGINE_SOCKET = [
    Rule("framing / sending (FramedStream.send, msgpack)", functions=("FramedStream.send", "encode_frame")),
    Rule("receiving frames (FramedStream.recv)", functions=("FramedStream.recv", "decode_message")),
    Rule("step events to outboxes (_dispatch, Outbox.put)", functions=("_dispatch", "Outbox.put")),
    Rule("relay loop (EngineServer._relay, memory streams)", functions=("EngineServer._relay",)),
    Rule("admission (EngineServer._generate and below)", functions=("EngineServer._generate",)),
    Rule("waiting for events (selector)", functions=_WAITS[:4], waiting=True),
]
API_MAIN = [
    Rule("SSE / JSON encoding (api render, sse, msgspec)", functions=("Renderer.",),
         files=r"^api/(sse|bodies)\.py$|^api/(\w+/)?render\.py$"),
    Rule("engine socket reading (ipc framing, engine_client)", functions=("next_event", "next_event_or_idle"),
         files=r"^ipc/|^api/engine_client\.py$"),
    Rule("uvicorn/h11 writing (RequestResponseCycle.send)",
         functions=("RequestResponseCycle.send", "_SelectorSocketTransport.write")),
    Rule("HTTP reading (uvicorn protocol, h11 parsing)",
         functions=("H11Protocol.", "EdgeProtocol.", "RequestResponseCycle.receive"), files=r"^h11/"),
    Rule("metrics and access log (api/metrics.py, api/access.py)", files=r"^api/(metrics|access)\.py$"),
    Rule("waiting for events (selector)", functions=_WAITS[:4], waiting=True),
]


def engine_rules(thread: str) -> list[Rule]:
    if thread == "MainThread":
        return ENGINE_MAIN
    if thread == "engine-socket":
        return ENGINE_SOCKET
    return [WAITING, Rule("watchdog (sleeps between checks)", functions=("Watchdog._run",), waiting=True)]


def api_rules(thread: str) -> list[Rule]:
    return API_MAIN if thread == "MainThread" else [WAITING]
