"""Speculation's figures as an operator reads them: /metrics, /health, status, against the fake engine's Info."""

from __future__ import annotations

import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

import ipc
from ops.status import describe_info

pytestmark = pytest.mark.anyio

BASE = dict(model="m", model_path="/m", context_length=4096, ranks=2, backend="ring", created=1, engine_pid=10)
# 40 passes verified drafts: 100 of 160 draft tokens kept, 140 tokens gained (3.5 per pass)
RUNNING = dict(spec_mode="ngram", spec_draft_tokens=4, spec_proposed_tokens=160, spec_accepted_tokens=100,
               spec_forward_passes=40, spec_emitted_tokens=140, spec_decode_positions=200)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


async def test_metrics_count_drafts_and_tokens_per_forward_pass(engine, client):
    engine.info = msgspec.structs.replace(engine.info, **RUNNING)
    s = samples((await client.get("/metrics")).text)
    assert s[("mcs_spec_proposed_tokens_total", ())] == 160
    assert s[("mcs_spec_accepted_tokens_total", ())] == 100
    assert s[("mcs_spec_forward_passes_total", ())] == 40
    assert s[("mcs_spec_emitted_tokens_total", ())] == 140
    assert s[("mcs_spec_tokens_per_forward", ())] == 3.5
    assert s[("mcs_spec_acceptance_ratio", ())] == 0.625
    assert s[("mcs_speculative_info", (("draft_tokens", "4"), ("mode", "ngram")))] == 1


async def test_metrics_before_any_draft(engine, client):
    s = samples((await client.get("/metrics")).text)
    assert s[("mcs_spec_proposed_tokens_total", ())] == 0
    assert s[("mcs_spec_tokens_per_forward", ())] == 1.0  # plain decoding: one token per pass
    assert s[("mcs_speculative_info", (("draft_tokens", "0"), ("mode", "off")))] == 1


async def test_health_reports_speculation(engine, client):
    engine.info = msgspec.structs.replace(engine.info, **RUNNING)
    body = (await client.get("/health")).json()
    assert body["speculative"] == {"mode": "ngram", "draft_tokens": 4, "proposed_tokens": 160, "accepted_tokens": 100,
                                   "acceptance": 0.625, "forward_passes": 40, "emitted_tokens": 140,
                                   "decode_positions": 200, "tokens_per_forward": 3.5}


@pytest.mark.parametrize(("kw", "line"), [
    ({}, "  speculation off (SPECULATIVE=off, or the model's caches cannot verify drafts: see the engine log)"),
    ({"spec_mode": "ngram", "spec_draft_tokens": 4}, "  speculation ngram, up to 4 draft tokens; no drafts verified yet"),
    (RUNNING, "  speculation ngram, up to 4 draft tokens; 100 of 160 proposed tokens accepted (62 %), "
              "3.50 tokens per forward pass with drafts"),
])
def test_status_line(kw, line):
    assert line in describe_info(ipc.Info(**BASE, **kw)).splitlines()
