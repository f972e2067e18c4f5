"""Is the engine alive? One verdict for /health and the dashboard, from a bounded Info wait.

A frozen rank leaves rank 0 waiting inside a collective: its socket thread may still answer
Info (then last_step_age and the rank reports grow) or may not (then the Info wait times out).
Both read as "stalled"; a socket that refuses connections reads as "unreachable". While the
engine idles, rank 0 asks every rank for its report over its own connection and knows which
ranks have not answered (RankState.unanswered): the verdict then names that rank and its host.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

import ipc
from starlette.requests import Request
from starlette.responses import Response

from api.bodies import json_response
from api.engine_client import EngineClient, EngineStalled
from api.errors import APIError
from api.metrics import acceptance, tokens_per_forward
from config import Settings

# How long /health waits for the engine's Info before calling it stalled.
INFO_TIMEOUT = 2.0


def engine_verdict(info: ipc.Info, deadline: float) -> str:
    """"ok", or "stalled: ..." naming what stopped: a rank that does not answer, the step loop, or a rank's
    reports."""
    silent = [r for r in info.rank_states if r.unanswered >= deadline]
    if silent:
        names = ", ".join(f"rank {r.rank} ({r.host or '?'}, pid {r.pid})" for r in silent)
        return f"stalled: {names} not answering for {max(r.unanswered for r in silent):.0f} s (frozen or gone)"
    if info.last_step_age >= deadline:
        return f"stalled: no step for {info.last_step_age:.0f} s"
    stale = [r for r in info.rank_states if r.report_age >= deadline]
    if stale:
        age = max(r.report_age for r in stale)
        if len(stale) > 1 and len(stale) == len(info.rank_states):
            # reports are gathered together: all old means the ranks stopped meeting, not which one froze
            return f"stalled: no rank report for {age:.0f} s (the ranks stopped meeting: one is frozen or gone)"
        names = ", ".join(f"rank {r.rank} ({r.host or '?'}, pid {r.pid})" for r in stale)
        return f"stalled: no report from {names} for {age:.0f} s"
    return "ok"


def details(info: ipc.Info) -> dict[str, Any]:
    return {
        "model": info.model,
        "context_length": info.context_length,
        "ranks": info.ranks,
        "backend": info.backend,
        "parallel": info.parallel,
        "pipeline_layers": info.pipeline_layers,
        "parallel_note": info.parallel_note,
        "engine_pid": info.engine_pid,
        "uptime": round(info.uptime, 1),
        "step": info.step,
        "last_step_age": round(info.last_step_age, 3),
        "active": info.active,
        "queued": info.queued,
        "max_batch": info.max_batch,
        "max_queue": info.max_queue,
        "prefill": {"tokens_per_step": info.prefill_chunk, "tokens_per_second": info.prefill_tokens_per_second},
        "prompt_cache": {"budget_bytes": info.prompt_cache_budget, "bytes": info.prompt_cache_bytes,
                         "entries": info.prompt_cache_entries, "hits": info.prompt_cache_hits,
                         "misses": info.prompt_cache_misses, "evictions": info.prompt_cache_evictions,
                         "prompt_tokens": info.prompt_tokens_total, "cached_tokens": info.prompt_tokens_cached,
                         "live_buffers": info.live_buffers, "live_buffers_budget": info.live_buffers_budget},
        # the disk tier: rank 0's files and its cap (0: off, or still opening), and rank 0's restores from it
        "prompt_cache_disk": {"entries": info.prompt_cache_disk_entries, "bytes": info.prompt_cache_disk_bytes,
                              "cap_bytes": info.prompt_cache_disk_cap_bytes, "hits": info.prompt_cache_disk_hits,
                              "restores": info.prompt_cache_disk_restores,
                              "restore_failures": info.prompt_cache_disk_restore_failures,
                              "writes": info.prompt_cache_disk_writes, "evictions": info.prompt_cache_disk_evictions,
                              "bytes_restored": info.prompt_cache_disk_bytes_restored,
                              "seconds_restoring": round(info.prompt_cache_disk_seconds_restoring, 4)},
        "speculative": {"mode": info.spec_mode, "draft_tokens": info.spec_draft_tokens,
                        "proposed_tokens": info.spec_proposed_tokens, "accepted_tokens": info.spec_accepted_tokens,
                        "acceptance": round(acceptance(info), 4), "forward_passes": info.spec_forward_passes,
                        "emitted_tokens": info.spec_emitted_tokens, "decode_positions": info.spec_decode_positions,
                        "tokens_per_forward": round(tokens_per_forward(info), 4)},
        "kv_memory": {"budget_bytes": info.kv_budget_bytes, "reserved_bytes": info.kv_reserved_bytes,
                      "token_bytes": info.kv_token_bytes, "window_token_bytes": info.kv_window_token_bytes,
                      "window_tokens": info.kv_window, "constant_bytes": info.kv_constant_bytes,
                      "measured": info.kv_measured, "precision": info.kv_precision, "bits": info.kv_bits,
                      "group_size": info.kv_group_size},
        "rank_states": [
            {**msgspec.structs.asdict(r), "report_age": round(r.report_age, 3), "unanswered": round(r.unanswered, 3)}
            for r in info.rank_states
        ],
        "links": [
            {**msgspec.structs.asdict(link), "age": round(link.age, 3)} for link in info.links
        ],
        # helper models beside the served one (their weights also in their rank's rank_states helper_bytes)
        "helpers": [msgspec.structs.asdict(h) for h in info.helpers],
        "helper_work": {"inputs": info.helper_inputs, "tokens": info.helper_tokens,
                        "seconds": round(info.helper_seconds, 3)},
    }


async def check(engine: EngineClient, settings: Settings, api_started: float) -> tuple[int, dict[str, Any]]:
    """(HTTP status, body) of /health: 200 only when the engine answers and every part progresses."""
    head: dict[str, Any] = {"api_uptime": round(time.monotonic() - api_started, 1),
                            "stall_deadline": settings.HEALTH_STALL_SECONDS}
    try:
        info = await engine.info(INFO_TIMEOUT)
    except EngineStalled as exc:
        return 503, {"status": "unavailable", "api": "ok", "engine": f"stalled: {exc.message}", **head}
    except APIError as exc:
        return 503, {"status": "unavailable", "api": "ok", "engine": f"unreachable: {exc.message}", **head}
    verdict = engine_verdict(info, settings.HEALTH_STALL_SECONDS)
    ok = verdict == "ok"
    body = {"status": "ok" if ok else "unavailable", "api": "ok", "engine": verdict, **head,
            **({"test_hooks": True} if info.test_hooks else {}), **details(info)}
    return (200 if ok else 503), body


def summary(body: dict[str, Any]) -> dict[str, Any]:
    """What a load balancer needs and anyone may read: the verdicts without the ranks' hosts, pids or traffic."""
    # test_hooks: an engine that reads test-only fault hooks must not pass unnoticed as a serving one
    return {"status": body["status"], "api": body["api"], "engine": body["engine"].partition(":")[0],
            **({"test_hooks": True} if body.get("test_hooks") else {})}


class Health:
    """GET /health: 200 only when the engine answers and its step loop and every rank are progressing.

    detailed: the whole body (the ranks, their hosts and pids, every tenant's traffic); else only the summary,
    for an open /health in front of several tenants.
    """

    def __init__(self, settings: Settings, engine: EngineClient, detailed: bool = True) -> None:
        self.settings = settings
        self.engine = engine
        self.detailed = detailed
        self.started = time.monotonic()

    async def endpoint(self, request: Request) -> Response:
        status, body = await check(self.engine, self.settings, self.started)
        return json_response(body if self.detailed else summary(body), status)
