"""The cluster runbook end to end on two local ranks with a cache each, from empty caches to a served request:
`download` fetches a model from a loopback stand-in for the Hugging Face hub and spreads it to the other rank
while the engine serves another model, `models` lists it on both, `switch` serves it with the same API process.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import httpx

from config.hub_cache import find_snapshot, read_manifest
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE
from tests.hubstub import HubStub
from tests.launch_stack import Launch

REPO_ID = "org/tiny-model"


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_from_empty_caches_to_a_served_request_with_the_same_api():
    source = ensure_zoo_model("qwen3", MODEL_CACHE)
    want = {p.name: _sha(p) for p in source.iterdir() if p.is_file()}
    with HubStub() as hub:
        hub.add(REPO_ID, source)
        launch = Launch(MODEL="demo-tiny", HOSTS="127.0.0.1,127.0.0.1", HF_ENDPOINT=hub.url)
        caches = [launch.root / "hub0", launch.root / "hub1"]
        launch.env["HUB_CACHE_PER_RANK"] = ",".join(map(str, caches))
        launch.start()
        try:
            api_pid = launch.group("api")

            r = launch.run("download", REPO_ID, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            said = r.stdout + r.stderr
            assert "download" in said and "spread" in said, said  # the person sees both phases go by
            assert hub.served.total == sum(p.stat().st_size for p in source.iterdir() if p.is_file())
            for cache in caches:  # every rank's cache: the source's bytes, and the manifest that says so
                snap = find_snapshot(cache, REPO_ID)
                assert snap is not None, f"{cache} lacks {REPO_ID}"
                assert {p.name: _sha(p) for p in snap.iterdir()} == want
                assert read_manifest(cache, REPO_ID) is not None

            r = launch.run("download", REPO_ID, timeout=300)  # whole everywhere: nothing moves again
            assert r.returncode == 0, r.stdout + r.stderr
            assert hub.served.total == sum(p.stat().st_size for p in source.iterdir() if p.is_file())

            r = launch.run("models", "--json", timeout=120)
            assert r.returncode == 0, r.stderr
            listed = json.loads(r.stdout)
            assert [place["ranks"] for place in listed["hosts"]] == [[0], [1]]
            for place in listed["hosts"]:
                assert [(m["repo"], m["complete"]) for m in place["models"]] == [(REPO_ID, True)], place

            r = launch.run("switch", REPO_ID, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr + launch.log_tail()
            assert launch.group("api") == api_pid
            assert [m["id"] for m in httpx.get(launch.url + "/v1/models", timeout=10).json()["data"]] == [REPO_ID]
            r = httpx.post(launch.url + "/v1/chat/completions", timeout=120, json={
                "model": REPO_ID, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})
            assert r.status_code == 200 and r.json()["model"] == REPO_ID, r.text
            assert r.json()["usage"]["completion_tokens"] > 0
        finally:
            launch.stop()
