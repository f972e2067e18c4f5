"""`launch.sh switch` on a running stack: the engine alone restarts on a repo id from the Hugging Face cache, the
API process stays, answers 503 engine_unavailable meanwhile, then names the new model; `models` lists it. A model
that cannot load is refused while the old engine serves, or, where only a rank's load tells, rolled back."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time

import httpx
import pytest

from config.hub_cache import Manifest, ManifestFile, sha256_file, snapshot_folder, write_manifest
from ipc.lifecycle import ExitCause
from ops.pidfile import Lock
from tests.harness import MODEL_CACHE, REPO, short_dir
from tests.launch_stack import Launch, wait_for

REPO_ID = "org/tiny-model"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


def lay_out_repo(hub, folder, repo: str = REPO_ID) -> None:
    """A generated model in the layout `download` leaves: the snapshot, refs/main, the manifest last."""
    snap = snapshot_folder(hub, repo, COMMIT)
    shutil.copytree(folder, snap)
    files = sorted(p for p in snap.rglob("*") if p.is_file())
    write_manifest(hub, Manifest(repo=repo, revision="main", commit=COMMIT, files=tuple(
        ManifestFile(str(p.relative_to(snap)), p.stat().st_size, sha256_file(p)) for p in files)))


def watch(url: str, stop: threading.Event, seen: list, chats: list | None = None) -> None:
    """Chat completions and model lists back to back, each answer's status, error code and Retry-After kept;
    chats: (time, status) of each chat completion."""
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            for r in (http.post("/v1/chat/completions", json={"model": "default", **CHAT}), http.get("/v1/models")):
                code = r.json().get("error", {}).get("code") if r.status_code != 200 else None
                seen.append((r.request.url.path, r.status_code, code, r.headers.get("retry-after")))
                if chats is not None and r.request.url.path == "/v1/chat/completions":
                    chats.append((time.monotonic(), r.status_code))
            time.sleep(0.05)


def broken(demo, tmp, what: str):
    """demo-tiny with a tokenizer.json that is JSON but no tokenizer, or a config its weights do not fit."""
    folder = tmp / what
    shutil.copytree(demo, folder)
    if what == "tokenizer":
        (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0", "truncation": None}))
    else:
        config = json.loads((folder / "config.json").read_text())
        config["intermediate_size"] *= 2
        (folder / "config.json").write_text(json.dumps(config))
    return folder


# what a rewrite would change: an assignment's spacing, the missing last newline; .env is restored byte for byte
ENV_TEXT = b"# mine\nLOG_LEVEL = INFO   # kept as written\nDRAIN_TIMEOUT=10"


def still_serving(launch: Launch, api_pid: int) -> None:
    """The old model answers through the same API process."""
    assert launch.group("api") == api_pid
    assert (launch.root / "empty.env").read_bytes() == ENV_TEXT
    assert [m["id"] for m in httpx.get(launch.url + "/v1/models", timeout=10).json()["data"]] == ["demo-tiny"]
    r = httpx.post(launch.url + "/v1/chat/completions", json={"model": "demo-tiny", **CHAT}, timeout=60)
    assert r.status_code == 200 and r.json()["model"] == "demo-tiny", r.text


def refused_while_serving(launch: Launch, api_pid: int, demo) -> None:
    """What only building the model tells is found before the running engine stops: no outage at all."""
    engine_pid = launch.group("engine")
    for what, said in (("tokenizer", "/tokenizer does not load (KeyError: 'added_tokens')"),
                       ("config", "/config/model.safetensors does not fit ")):
        folder = broken(demo, launch.root, what)
        r = launch.run("switch", str(folder), timeout=180)
        assert r.returncode == 1, r.stdout + r.stderr
        (sentence,) = [line for line in r.stderr.splitlines() if said in line]
        assert sentence.endswith("; demo-tiny keeps serving, .env unchanged"), sentence
        assert launch.group("engine") == engine_pid
        still_serving(launch, api_pid)


def rolled_back(launch: Launch, api_pid: int, demo, hubs) -> float:
    """A repo whose copy in rank 1's cache has a broken tokenizer passes rank 0's checks; rank 1's load fails,
    and the switch starts demo-tiny again by itself. Returns how long chat completions answered 503."""
    lay_out_repo(hubs[0], demo, "org/broken")
    lay_out_repo(hubs[1], broken(demo, launch.root, "tokenizer"), "org/broken")
    stop, seen, chats = threading.Event(), [], []
    watcher = threading.Thread(target=watch, args=(launch.url, stop, seen, chats), daemon=True)
    watcher.start()
    try:
        wait_for(lambda: len(chats) >= 1, 30, "the watcher's first answer")
        r = launch.run("switch", "org/broken", timeout=300)
    finally:
        stop.set()
        watcher.join(timeout=60)
    assert r.returncode == 1, r.stdout + r.stderr + launch.log_tail()
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("launch.sh: the switch to org/broken failed and was rolled back (demo-tiny serves again, "
                           f".env is as it was): rank 1 could not load the model: the tokenizer in {hubs[1]}/"), last
    assert last.endswith(" does not load (KeyError: 'added_tokens'): copy tokenizer.json and tokenizer_config.json "
                         "again from the original model"), last
    still_serving(launch, api_pid)
    assert {status for _, status in chats} == {200, 503}, sorted(set(seen))
    down = [t for t, status in chats if status == 503]
    return down[-1] - down[0]


# one rank takes the same path as each of two: CI_SLOW=1 runs it
@pytest.mark.parametrize("ranks", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_switch_serves_a_cached_repo_id_with_the_same_api_process(ranks: int):
    # two local ranks get a cache each, so each finds the model in its own folder
    launch = Launch(MODEL="demo-tiny", HOSTS=",".join(["127.0.0.1"] * ranks))
    hubs = [launch.root / f"hub{rank}" for rank in range(ranks)]
    launch.env["HUB_CACHE_PER_RANK"] = ",".join(map(str, hubs))
    (launch.root / "empty.env").write_bytes(ENV_TEXT)
    launch.start()
    stop, seen = threading.Event(), []
    watcher = threading.Thread(target=watch, args=(launch.url, stop, seen), daemon=True)
    try:
        api_pid = launch.group("api")
        (demo,) = MODEL_CACHE.glob("demo-tiny-v*")
        if ranks == 1:
            refused_while_serving(launch, api_pid, demo)
        else:
            outage = rolled_back(launch, api_pid, demo, hubs)
            print(f"rollback outage: chat completions answered 503 for {outage:.1f} s")
        lay_out_repo(hubs[0], demo)
        if ranks == 2:  # on rank 0 only: refused, naming rank 1's cache
            r = launch.run("switch", REPO_ID)
            assert r.returncode == 1, r.stderr
            assert f"127.0.0.1 (rank 1, cache {hubs[1]}) lacks it: run ./launch.sh download {REPO_ID}" in r.stderr
            assert "rank 0" not in r.stderr
            lay_out_repo(hubs[1], demo)
        r = launch.run("switch", "org/absent")
        assert r.returncode == 1 and "lacks it: run ./launch.sh download org/absent" in r.stderr, r.stderr
        assert httpx.get(launch.url + "/v1/models", timeout=10).json()["data"][0]["id"] == "demo-tiny"

        watcher.start()
        wait_for(lambda: len(seen) >= 2, 30, "the watcher's first answers")
        r = launch.run("switch", REPO_ID, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr + launch.log_tail()
        stop.set()
        watcher.join(timeout=60)

        assert launch.group("api") == api_pid  # the API was not restarted
        for rank, hub in enumerate(hubs):  # each rank loaded the snapshot in its own cache
            log = (launch.root / "logs" / f"engine.rank{rank}.log").read_text()
            assert f"loaded from {snapshot_folder(hub, REPO_ID, COMMIT)}" in log
        assert f"MODEL={REPO_ID}" in (launch.root / "empty.env").read_text()
        for path in ("/v1/chat/completions", "/v1/models"):
            assert (path, 503, "engine_unavailable", "5") in seen, (path, sorted(set(seen)))
        assert {s[1] for s in seen} <= {200, 503}, sorted(set(seen))

        models = httpx.get(launch.url + "/v1/models", timeout=10).json()
        assert [m["id"] for m in models["data"]] == [REPO_ID]
        r = httpx.post(launch.url + "/v1/chat/completions", json={"model": REPO_ID, **CHAT}, timeout=60)
        assert r.status_code == 200 and r.json()["model"] == REPO_ID, r.text
        r = httpx.post(launch.url + "/v1/chat/completions", json={"model": "demo-tiny", **CHAT}, timeout=60)
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
        health = httpx.get(launch.url + "/health", timeout=10).json()
        assert health["model"] == REPO_ID

        r = launch.run("models", "--json", timeout=120)
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert (doc["served"], doc["engine"]) == (REPO_ID, "up")
        assert [place["ranks"] for place in doc["hosts"]] == [[rank] for rank in range(ranks)]
        for place in doc["hosts"]:
            (cached,) = [m for m in place["models"] if m["repo"] == REPO_ID]
            assert (cached["repo"], cached["commit"], cached["complete"]) == (REPO_ID, COMMIT, True)
        assert json.loads((launch.root / "run" / "models.json").read_text())["served"] == REPO_ID
    finally:
        stop.set()
        launch.stop()


def test_a_rank_never_downloads_a_repo_id_its_cache_lacks_or_holds_incomplete(tmp_path):
    (demo,) = MODEL_CACHE.glob("demo-tiny-v*")
    hub, run = tmp_path / "hub", short_dir("mcsr-")
    env = {**os.environ, "ENV_FILE": "/nonexistent", "HUB_CACHE": str(hub), "RUN_DIR": str(run),
           "LOG_DIR": str(tmp_path / "logs"), "MODEL": REPO_ID, "HF_HUB_OFFLINE": "0"}
    env.pop("MLX_RANK", None)

    def engine_says() -> str:
        r = subprocess.run([sys.executable, "-m", "engine"], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=120, stdin=subprocess.DEVNULL)
        assert r.returncode == ExitCause.MODEL, r.stderr
        return r.stderr

    said = engine_says()
    assert (f"cannot be loaded on host {socket.gethostname()} (rank 0): {REPO_ID} (main) is not in the Hugging Face "
            f"cache {hub}; run ./launch.sh download {REPO_ID}") in said, said
    lay_out_repo(hub, demo)
    (snapshot_folder(hub, REPO_ID, COMMIT) / "model.safetensors").unlink()
    said = engine_says()
    assert f"{REPO_ID} is incomplete in {hub}: 1 of " in said and "(model.safetensors)" in said, said

    # launch.sh start says the same before starting any rank
    launch = Launch(MODEL=REPO_ID, HUB_CACHE=str(hub))
    r = launch.run("start")
    assert r.returncode == 1 and f"is incomplete in {hub}" in r.stderr and "./launch.sh download" in r.stderr, r.stderr
    assert not (launch.root / "run" / "engine.pid").exists()
    shutil.rmtree(launch.root, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)


def test_a_switch_while_another_launch_sh_changes_the_services_changes_nothing():
    """A start, stop or restart under way holds the launch lock: a switch meanwhile would write .env (the next
    start then serves what the one under way did not) and say "nothing runs"; it is refused like them."""
    launch = Launch(MODEL="demo-tiny")
    (launch.root / "run").mkdir(mode=0o700)
    lock = Lock(launch.root / "run" / "launch.lock")
    lock.acquire()  # as a ./launch.sh start would, while it starts the engine
    try:
        r = launch.run("switch", "zoo-qwen3")
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"another ./launch.sh (pid {os.getpid()}) is changing the services" in r.stderr, r.stderr
        assert (launch.root / "empty.env").read_text() == ""
        lock.release()
        r = launch.run("switch", "zoo-qwen3")
        assert r.returncode == 0 and "nothing runs" in r.stderr, r.stderr
        assert "MODEL=zoo-qwen3" in (launch.root / "empty.env").read_text()
    finally:
        lock.release()
        shutil.rmtree(launch.root, ignore_errors=True)


def test_a_switch_to_a_cached_repo_that_is_no_model_is_refused_before_env_changes(tmp_path):
    """A repo downloaded whole that holds no model (a typo'd name: only a README) passes the every-rank check;
    what a start would refuse is refused before .env is written, so .env never names what cannot load."""
    hub = tmp_path / "hub"
    readme = tmp_path / "src" / "README.md"
    readme.parent.mkdir()
    readme.write_text("# not a model\n")
    lay_out_repo(hub, readme.parent)
    launch = Launch(MODEL="demo-tiny", HUB_CACHE=str(hub))
    try:
        r = launch.run("switch", REPO_ID)
        assert r.returncode == 1, r.stdout + r.stderr
        assert "has no config.json" in r.stderr, r.stderr
        assert (launch.root / "empty.env").read_text() == ""
    finally:
        shutil.rmtree(launch.root, ignore_errors=True)
