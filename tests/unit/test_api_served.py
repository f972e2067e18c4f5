"""The API names the model the engine serves (its Info), so a switch of the engine's model needs no API restart."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

pytestmark = pytest.mark.anyio

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}


async def test_every_dialect_names_the_model_the_engine_switched_to(engine, make_client, tmp_path: Path) -> None:
    async with make_client(RUN_DIR=tmp_path) as client:
        assert (await client.get("/v1/models")).json()["data"][0]["id"] == "test-model"
        # the engine restarted on another model; nothing told the API
        engine.info = msgspec.structs.replace(engine.info, model="org/new-model", engine_pid=4343)

        r = await client.post("/v1/chat/completions", json={"model": "org/new-model", **CHAT})
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "org/new-model"
        r = await client.post("/v1/chat/completions", json={"model": "test-model", **CHAT})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        assert "serves 'org/new-model'" in r.json()["error"]["message"]

        assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["org/new-model"]
        assert (await client.get("/v1/models/org/new-model")).status_code == 200
        assert (await client.get("/v1/models/test-model")).status_code == 404
        r = await client.post("/v1/messages", json={"model": "org/new-model", **CHAT})
        assert r.status_code == 200 and r.json()["model"] == "org/new-model"
        assert [m["name"] for m in (await client.get("/api/tags")).json()["models"]] == ["org/new-model"]
        show = (await client.post("/api/show", json={"model": "org/new-model"})).json()
        assert show["model_info"]["general.basename"] == "org/new-model"
        doc = (await client.get("/openapi.json")).json()
        example = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["example"]
        assert example["model"] == "org/new-model"


async def test_while_the_engine_switches_models_and_chats_answer_503(engine, socket_path, make_client,
                                                                     tmp_path: Path) -> None:
    async with make_client(RUN_DIR=tmp_path) as client:
        assert (await client.get("/v1/models")).status_code == 200
        os.unlink(socket_path)  # the engine is gone as far as the API can tell
        (tmp_path / "engine.switching.json").write_text(json.dumps({"model": "org/new-model"}))
        for r in (await client.get("/v1/models"), await client.get("/api/tags"),
                  await client.post("/v1/chat/completions", json={"model": "test-model", **CHAT})):
            assert r.status_code == 503, r.text
            assert r.headers["retry-after"] == "5"
        r = await client.get("/v1/models")
        assert r.json()["error"]["code"] == "engine_unavailable"
        assert "switching to the model org/new-model" in r.json()["error"]["message"]
        # a plain restart (no switch under way): the last Info still answers the model list
        (tmp_path / "engine.switching.json").unlink()
        assert (await client.get("/v1/models")).status_code == 200
