"""/v1/models and /health."""

from __future__ import annotations

import os

import msgspec
import pytest

pytestmark = pytest.mark.anyio

MODEL = {
    "id": "test-model",
    "object": "model",
    "created": 1_700_000_000,
    "owned_by": "mlx-cluster-serve",
    "context_length": 4096,
    "input_modalities": ["text"],
}


async def test_list_and_get_model(engine, client):
    r = await client.get("/v1/models")
    assert r.status_code == 200
    assert r.json() == {"object": "list", "data": [MODEL]}
    assert (await client.get("/v1/models/test-model")).json() == MODEL
    r = await client.get("/v1/models/gpt-4o")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found"


async def test_models_without_any_info_is_503(client):
    r = await client.get("/v1/models")
    assert r.status_code == 503
    assert r.headers["retry-after"] == "5"
    assert r.json()["error"]["code"] == "engine_unavailable"


async def test_models_served_from_cache_while_the_engine_is_down(engine, socket_path, client):
    assert (await client.get("/v1/models")).status_code == 200
    os.unlink(socket_path)  # the engine is gone as far as the API can tell
    r = await client.get("/v1/models")
    assert r.status_code == 200
    assert r.json()["data"] == [MODEL]


async def test_health_ok_with_details(engine, client):
    r = await client.get("/health")
    assert r.status_code == 200
    body = r.json()
    assert (body["status"], body["api"], body["engine"]) == ("ok", "ok", "ok")
    assert (body["model"], body["ranks"], body["backend"], body["engine_pid"]) == ("test-model", 2, "ring", 4242)


async def test_health_engine_unreachable(client):
    r = await client.get("/health")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "unavailable" and body["api"] == "ok"
    assert body["engine"].startswith("unreachable: ")


async def test_health_engine_stalled(engine, make_client):
    engine.info = msgspec.structs.replace(engine.info, last_step_age=45.0)
    async with make_client(WATCHDOG_TIMEOUT=30) as client:
        r = await client.get("/health")
    assert r.status_code == 503
    assert r.json()["engine"] == "stalled: no step for 45 s"
