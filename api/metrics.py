"""Prometheus metrics at /metrics: the gateway's own counters and the engine's state from Info.

Each app owns a CollectorRegistry (never the global one), so tests can build several apps.
Request metrics are observed by the access-log middleware; engine gauges are refreshed from a
bounded Info call at scrape time. The same object keeps the recent requests the dashboard shows.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import Completed
from api.engine_client import EngineClient
from api.errors import APIError

PREFIX = "mcs"
# /metrics waits at most this long for the engine; a scrape without it reports mcs_engine_up 0.
SCRAPE_INFO_TIMEOUT = 1.0
RECENT_REQUESTS = 50
RECENT_ERRORS = 20

TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)


def is_generation(done: Completed) -> bool:
    """A request the engine admitted (the others never reached it or were refused)."""
    return done.prompt_tokens is not None


class Metrics:
    """The gateway's metrics and its recent requests; an access-log observer."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(f"{PREFIX}_requests", "HTTP requests by route and status.",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter(f"{PREFIX}_prompt_tokens", "Prompt tokens of admitted requests.", registry=r)
        self.generation_tokens = Counter(f"{PREFIX}_generation_tokens",
                                         "Generated tokens, counted as they reach the API.", registry=r)
        self.ttft = Histogram(f"{PREFIX}_time_to_first_token_seconds",
                              "From the request's arrival to its first generated token.",
                              ["endpoint"], buckets=TTFT_BUCKETS, registry=r)
        self.e2e = Histogram(f"{PREFIX}_e2e_request_latency_seconds",
                             "From the request's arrival to its last byte, for admitted requests.",
                             ["endpoint"], buckets=E2E_BUCKETS, registry=r)
        self.itl = Histogram(f"{PREFIX}_inter_token_latency_seconds",
                             "Time between consecutive generated tokens of one request.",
                             buckets=ITL_BUCKETS, registry=r)
        self.engine_state = EngineCollector(engine)
        r.register(self.engine_state)
        ProcessCollector(namespace=f"{PREFIX}_api", registry=r)
        # for the dashboard
        self.recent: deque[Completed] = deque(maxlen=RECENT_REQUESTS)
        self.errors: deque[Completed] = deque(maxlen=RECENT_ERRORS)
        self.generated_total = 0
        self.requests_total = 0
        self.rate = TokenRate()

    # ---- access-log observer

    def tokens(self, count: int, gap: float | None) -> None:
        self.generated_total += count
        self.rate.add(count)
        self.generation_tokens.inc(count)
        if gap is not None:
            for _ in range(count):
                self.itl.observe(gap)

    def finished(self, done: Completed) -> None:
        self.requests.labels(done.endpoint, str(done.status)).inc()
        if is_generation(done):
            self.prompt_tokens.inc(done.prompt_tokens or 0)
            self.e2e.labels(done.endpoint).observe(done.duration)
            if done.ttft is not None:
                self.ttft.labels(done.endpoint).observe(done.ttft)
        if done.path.startswith(("/v1/", "/api/")):
            self.requests_total += 1
            self.recent.append(done)
            if done.status >= 400 or done.outcome:
                self.errors.append(done)

    # ---- scraping

    async def refresh(self) -> ipc.Info | None:
        """Fresh Info for the engine gauges (None, and mcs_engine_up 0, when the engine does not answer)."""
        try:
            info = await self.engine.info(SCRAPE_INFO_TIMEOUT)
        except APIError:
            info = None
        self.engine_state.info = info
        return info

    async def endpoint(self, request: Request) -> Response:
        await self.refresh()
        return Response(generate_latest(self.registry), media_type=CONTENT_TYPE_LATEST)


class TokenRate:
    """Generated tokens per whole second over the last minute (the dashboard's sparkline)."""

    def __init__(self, seconds: int = 60) -> None:
        self.seconds = seconds
        self._buckets: dict[int, int] = {}

    def add(self, count: int, at: float | None = None) -> None:
        second = int(time.monotonic() if at is None else at)
        self._buckets[second] = self._buckets.get(second, 0) + count
        if len(self._buckets) > 2 * self.seconds:
            oldest = second - self.seconds
            self._buckets = {s: c for s, c in self._buckets.items() if s >= oldest}

    def series(self, at: float | None = None) -> list[int]:
        """Tokens in each of the last complete seconds, oldest first."""
        now = int(time.monotonic() if at is None else at)
        return [self._buckets.get(s, 0) for s in range(now - self.seconds, now)]


class EngineCollector(Collector):
    """Engine state from the last scrape's Info; its cumulative timings become summaries."""

    def __init__(self, engine: EngineClient) -> None:
        self.engine = engine
        self.info: ipc.Info | None = None

    def describe(self) -> list[Metric]:
        return []  # collected on demand: nothing to describe before the first scrape

    def collect(self) -> Iterator[Metric]:
        info = self.info
        yield GaugeMetricFamily(f"{PREFIX}_engine_up", "1 when engine rank 0 answered this scrape's Info.",
                                value=1 if info is not None else 0)
        yield CounterMetricFamily(f"{PREFIX}_engine_reconnects", "Times the API got the engine back after losing it "
                                  "(or found another engine process).", value=self.engine.reconnects)
        if info is None:
            return
        yield InfoMetricFamily(f"{PREFIX}_engine", "The served model and the engine's topology.",
                               value={"model": info.model, "backend": info.backend, "ranks": str(info.ranks),
                                      "context_length": str(info.context_length)})
        yield GaugeMetricFamily(f"{PREFIX}_queue_depth", "Requests waiting for a batch slot.", value=info.queued)
        yield GaugeMetricFamily(f"{PREFIX}_active_sequences", "Sequences in the running batch.", value=info.active)
        yield GaugeMetricFamily(f"{PREFIX}_max_batch", "Batch slots (MAX_BATCH).", value=info.max_batch)
        yield GaugeMetricFamily(f"{PREFIX}_engine_uptime_seconds", "Seconds since the engine started.",
                                value=info.uptime)
        yield GaugeMetricFamily(f"{PREFIX}_engine_last_step_age_seconds",
                                "Seconds since the step loop's last step or idle heartbeat.", value=info.last_step_age)
        yield CounterMetricFamily(f"{PREFIX}_engine_steps", "Plans the step loop made (on several ranks, idle ticks too; a single rank plans only work).",
                                  value=info.step)
        yield SummaryMetricFamily(f"{PREFIX}_engine_step_seconds", "Batched forward steps on rank 0.",
                                  count_value=info.step_time_count, sum_value=info.step_time_sum)
        yield SummaryMetricFamily(f"{PREFIX}_engine_plan_broadcast_seconds",
                                  "Step-plan broadcasts from rank 0 to every rank.",
                                  count_value=info.broadcast_time_count, sum_value=info.broadcast_time_sum)
        yield from _prefix_cache(info)
        yield from _speculative(info)
        yield from _kv_memory(info)
        memory = GaugeMetricFamily(f"{PREFIX}_rank_memory_bytes", "MLX memory of each rank (active, cache, peak).",
                                   labels=["rank", "host", "kind"])
        host = GaugeMetricFamily(f"{PREFIX}_rank_host_memory_bytes", "Memory of each rank's host (total, available).",
                                 labels=["rank", "host", "kind"])
        age = GaugeMetricFamily(f"{PREFIX}_rank_report_age_seconds", "Seconds since each rank last reported.",
                                labels=["rank", "host"])
        step = GaugeMetricFamily(f"{PREFIX}_rank_step", "The step each rank last reported.", labels=["rank", "host"])
        cached = GaugeMetricFamily(f"{PREFIX}_rank_prompt_cache_bytes",
                                   "KV bytes of each rank's shard of the prefix cache.", labels=["rank", "host"])
        for r in info.rank_states:
            labels = [str(r.rank), r.host]
            memory.add_metric([*labels, "active"], r.active_memory)
            memory.add_metric([*labels, "cache"], r.cache_memory)
            memory.add_metric([*labels, "peak"], r.peak_memory)
            host.add_metric([*labels, "total"], r.host_memory_total)
            host.add_metric([*labels, "available"], r.host_memory_available)
            age.add_metric(labels, r.report_age)
            step.add_metric(labels, r.step)
            cached.add_metric(labels, r.prompt_cache_bytes)
        yield from (memory, host, age, step, cached)
        yield from _links(info)
        yield from _helpers(info)


def _helpers(info: ipc.Info) -> Iterator[Metric]:
    """The helper models beside the served one (EMBEDDING_MODEL, RERANK_MODEL) and their work so far."""
    weights = GaugeMetricFamily(f"{PREFIX}_helper_weight_bytes", "Weights of each helper model, on the rank it is "
                                "pinned to.", labels=["kind", "name", "rank"])
    for h in info.helpers:
        weights.add_metric([h.kind, h.name, str(h.rank)], h.weight_bytes)
    yield weights
    yield CounterMetricFamily(f"{PREFIX}_helper_inputs", "Inputs (embeddings) and documents (rerank) the helpers "
                              "computed.", value=info.helper_inputs)
    yield CounterMetricFamily(f"{PREFIX}_helper_tokens", "Input tokens the helpers computed, padding included.",
                              value=info.helper_tokens)
    yield CounterMetricFamily(f"{PREFIX}_helper_seconds", "Seconds rank 0 spent on helper work between steps.",
                              value=info.helper_seconds)


def _links(info: ipc.Info) -> Iterator[Metric]:
    """The links between ranks as the engine last probed them (idle, about once a minute)."""
    labels = ["a", "b", "host_a", "host_b"]
    latency = GaugeMetricFamily(f"{PREFIX}_link_latency_seconds",
                                "One-way latency between ranks a and b: half the median round trip of a one-byte "
                                "send/recv, probed while the engine idles (ring: neighbours; JACCL: every pair).",
                                labels=labels)
    bandwidth = GaugeMetricFamily(f"{PREFIX}_link_bandwidth_bytes_per_second",
                                  "Bandwidth from rank a to rank b: one send of 256 KiB to 4 MiB (sized to take "
                                  "about 20 ms) answered by one byte, the fastest one-byte round trip taken out (at "
                                  "most half the time), probed while the engine idles (ring: neighbours; JACCL: "
                                  "every pair).",
                                  labels=labels)
    age = GaugeMetricFamily(f"{PREFIX}_link_probe_age_seconds", "Seconds since the link between ranks a and b was "
                            "probed.", labels=labels)
    for link in info.links:
        values = [str(link.a), str(link.b), link.host_a, link.host_b]
        latency.add_metric(values, link.latency_seconds)
        bandwidth.add_metric(values, link.bandwidth_bytes_per_second)
        age.add_metric(values, link.age)
    yield from (latency, bandwidth, age)


def _prefix_cache(info: ipc.Info) -> Iterator[Metric]:
    """The prefix cache as rank 0 sees it; computed = total - cached is the prefill work actually done."""
    yield GaugeMetricFamily(f"{PREFIX}_prompt_cache_budget_bytes",
                            "KV bytes per rank the prefix cache may hold (PROMPT_CACHE_BYTES; 0: off).",
                            value=info.prompt_cache_budget)
    yield GaugeMetricFamily(f"{PREFIX}_prompt_cache_bytes", "KV bytes per rank the prefix cache holds.",
                            value=info.prompt_cache_bytes)
    yield GaugeMetricFamily(f"{PREFIX}_prompt_cache_entries", "Sequences the prefix cache holds.",
                            value=info.prompt_cache_entries)
    yield CounterMetricFamily(f"{PREFIX}_prompt_cache_hits", "Sequences that started from a cached prefix.",
                              value=info.prompt_cache_hits)
    yield CounterMetricFamily(f"{PREFIX}_prompt_cache_misses", "Sequences that found no cached prefix worth reusing.",
                              value=info.prompt_cache_misses)
    yield CounterMetricFamily(f"{PREFIX}_prompt_cache_evictions", "Entries evicted (least recently used first).",
                              value=info.prompt_cache_evictions)
    yield from _prefix_disk(info)
    yield GaugeMetricFamily(f"{PREFIX}_live_buffers", "Arrays (Metal buffers) the batch and the prefix cache hold on "
                            "rank 0, as of the last store or eviction.", value=info.live_buffers)
    yield GaugeMetricFamily(f"{PREFIX}_live_buffers_budget", "Arrays per rank beyond which prefix-cache entries are "
                            "evicted (MAX_LIVE_BUFFERS; 0: no cap).", value=info.live_buffers_budget)
    yield CounterMetricFamily(f"{PREFIX}_engine_prompt_tokens",
                              "Prompt tokens of the sequences that joined the batch.", value=info.prompt_tokens_total)
    yield CounterMetricFamily(f"{PREFIX}_prompt_cache_tokens",
                              "Of those, tokens whose KV came from the prefix cache instead of being computed.",
                              value=info.prompt_tokens_cached)


# The prefix cache's disk tier: rank 0's files, and its restores (failures: a file some rank lacked or found damaged,
# the prompt computed instead). Each is Info's prompt_cache_disk_<name>.
_DISK = (
    (GaugeMetricFamily, "entries", "Prefix cache entries on rank 0's disk tier."),
    (GaugeMetricFamily, "bytes", "Bytes of rank 0's disk tier files."),
    (GaugeMetricFamily, "cap_bytes",
     "Bytes per rank the disk tier may hold (PROMPT_CACHE_DISK_BYTES; 0: off or opening)."),
    (CounterMetricFamily, "hits", "Lookups that chose a disk entry to restore."),
    (CounterMetricFamily, "restores", "Disk entries every rank restored."),
    (CounterMetricFamily, "restore_failures", "Restores some rank could not load (missing or damaged): computed."),
    (CounterMetricFamily, "writes", "Entries rank 0 wrote to its disk tier."),
    (CounterMetricFamily, "evictions", "Entries rank 0 deleted, oldest use first, to stay under the cap."),
    (CounterMetricFamily, "bytes_restored", "Bytes rank 0 read back from disk (over seconds_restoring: the rate)."),
    (CounterMetricFamily, "seconds_restoring", "Seconds rank 0 spent reading, checking and rebuilding entries."),
)


def _prefix_disk(info: ipc.Info) -> Iterator[Metric]:
    for family, name, text in _DISK:
        yield family(f"{PREFIX}_prompt_cache_disk_{name}", text, value=getattr(info, f"prompt_cache_disk_{name}"))


def _speculative(info: ipc.Info) -> Iterator[Metric]:
    """Speculative decoding: rate(emitted) / rate(forward passes) is tokens per target forward pass over a window,
    the gauge the same since the engine started."""
    yield InfoMetricFamily(f"{PREFIX}_speculative", "Speculative decoding as the engine runs it (mode off also where "
                           "the model's caches cannot verify drafts).",
                           value={"mode": info.spec_mode, "draft_tokens": str(info.spec_draft_tokens)})
    yield CounterMetricFamily(f"{PREFIX}_spec_proposed_tokens", "Draft tokens the target model verified (rank 0's "
                              "proposals, up to each sequence's max_tokens and end).", value=info.spec_proposed_tokens)
    yield CounterMetricFamily(f"{PREFIX}_spec_accepted_tokens", "Draft tokens the target model verified and kept.",
                              value=info.spec_accepted_tokens)
    yield CounterMetricFamily(f"{PREFIX}_spec_forward_passes", "A sequence's target forward passes that verified "
                              "drafts (a step verifying three sequences' drafts counts three).",
                              value=info.spec_forward_passes)
    yield CounterMetricFamily(f"{PREFIX}_spec_emitted_tokens", "Tokens those sequences gained in those passes "
                              "(accepted drafts plus the target's own token).", value=info.spec_emitted_tokens)
    yield GaugeMetricFamily(f"{PREFIX}_spec_tokens_per_forward", "Tokens a sequence gains per target forward pass "
                            "that verified drafts, since the engine started (1 without speculation).",
                            value=tokens_per_forward(info))
    yield GaugeMetricFamily(f"{PREFIX}_spec_acceptance_ratio", "Accepted over proposed draft tokens since the engine "
                            "started (0 before any proposal).", value=acceptance(info))


def tokens_per_forward(info: ipc.Info) -> float:
    """Tokens per target forward pass that verified drafts (1.0 before any)."""
    return info.spec_emitted_tokens / info.spec_forward_passes if info.spec_forward_passes else 1.0


def acceptance(info: ipc.Info) -> float:
    return info.spec_accepted_tokens / info.spec_proposed_tokens if info.spec_proposed_tokens else 0.0


def _kv_memory(info: ipc.Info) -> Iterator[Metric]:
    """KV memory per rank as rank 0 estimates it: the running sequences' reservation and the prefix cache
    stay within the budget together."""
    yield InfoMetricFamily(f"{PREFIX}_kv_cache", "How the KV cache stores keys and values: precision is the model's "
                           "float type (bits 0) or KV_BITS with KV_GROUP_SIZE.",
                           value={"precision": info.kv_precision, "bits": str(info.kv_bits),
                                  "group_size": str(info.kv_group_size)})
    yield GaugeMetricFamily(f"{PREFIX}_kv_budget_bytes", "KV bytes per rank for running sequences and the prefix "
                            "cache together (KV_MEMORY_BYTES; 0: no limit).", value=info.kv_budget_bytes)
    yield GaugeMetricFamily(f"{PREFIX}_kv_reserved_bytes", "KV bytes per rank the running sequences may take "
                            "(prompt plus max_tokens each, as the padded batch holds them).",
                            value=info.kv_reserved_bytes)
    yield GaugeMetricFamily(f"{PREFIX}_kv_token_bytes", "KV bytes per rank one more token of a sequence takes in the "
                            "layers that keep every token (measured from the model's caches at load).",
                            value=info.kv_token_bytes)
    yield GaugeMetricFamily(f"{PREFIX}_kv_window_token_bytes", "KV bytes per rank one token takes in the "
                            "sliding-window layers, up to mcs_kv_window_tokens tokens.",
                            value=info.kv_window_token_bytes)
    yield GaugeMetricFamily(f"{PREFIX}_kv_window_tokens", "Tokens a sliding-window layer keeps (0: none).",
                            value=info.kv_window)
    yield GaugeMetricFamily(f"{PREFIX}_kv_constant_bytes", "Bytes per rank every sequence holds whatever its length "
                            "(linear attention's state).", value=info.kv_constant_bytes)
