"""./launch.sh check, sync and the ops side of start/status/stop, against local hosts and broken setups.

Remote hosts are played by stub `ssh`, `rsync` and `ibv_devinfo` commands on PATH: the stub
ssh runs the remote command here, so the probe really travels the ssh path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

from engine.gguf import VERSION as PACKAGED_VERSION
from ops.procs import free_ring_port
from tests.harness import MODEL_CACHE, REPO, free_port, short_dir

SSH_STUB = """#!/usr/bin/env bash
printf 'ssh %s\\n' "$*" >>"$STUB_LOG"
while [[ $1 == -o ]]; do shift 2; done
[[ $1 == -- ]] && shift
host=$1; shift
case $host in
    unreachable*) echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255 ;;
esac
[[ ${STUB_SSH_EXEC:-1} == 1 ]] || exit 0
exec sh -c "$*"
"""
RSYNC_STUB = """#!/usr/bin/env bash
printf 'rsync %s\\n' "$*" >>"$STUB_LOG"
"""
IBV_STUB = """#!/usr/bin/env bash
cat <<'EOF'
hca_id: rdma_en3
        transport:                      InfiniBand (0)
                port:   1
                        state:                  PORT_ACTIVE (4)
hca_id: rdma_en4
                port:   1
                        state:                  PORT_DOWN (1)
EOF
"""


@pytest.fixture
def env(tmp_path):
    """launch.sh's environment: private dirs, no developer .env, stub commands first on PATH."""
    root = short_dir("mcs-l-")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("ssh", SSH_STUB), ("rsync", RSYNC_STUB)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (root / "empty.env").touch()
    e = dict(os.environ)
    e.update(ENV_FILE=str(root / "empty.env"), RUN_DIR=str(root / "run"), LOG_DIR=str(root / "logs"),
             MODEL_CACHE_DIR=str(MODEL_CACHE), PATH=f"{bin_dir}:{e['PATH']}", STUB_LOG=str(tmp_path / "stub.log"),
             API_HOST="127.0.0.1", API_PORT=str(free_port()), RING_PORT=str(free_ring_port(2)))
    for key in ("HOSTS", "HOSTFILE", "BACKEND", "MODEL"):
        e.pop(key, None)
    e["_bin"], e["_root"] = str(bin_dir), str(root)
    yield e
    shutil.rmtree(root, ignore_errors=True)


def launch(env: dict, *args: str, timeout: float = 120, **more: str) -> subprocess.CompletedProcess:
    e = {k: v for k, v in {**env, **more}.items() if not k.startswith("_")}
    return subprocess.run([str(REPO / "launch.sh"), *args], env=e, capture_output=True, text=True, timeout=timeout)


def stub_log(env: dict) -> str:
    path = Path(env["STUB_LOG"])
    return path.read_text() if path.exists() else ""


def verdicts(out: str) -> dict[str, str]:
    """host -> its verdict column in the table."""
    rows = {}
    for line in out.splitlines():
        m = re.match(r"^(\S+)\s+[\d,]+\s+.*\s(OK|FAULT \(\d+\))$", line)
        if m:
            rows[m.group(1)] = m.group(2)
    return rows


def test_check_passes_on_local_hosts(env):
    r = launch(env, "check", HOSTS="127.0.0.1,127.0.0.1,localhost", SPECULATIVE="ngram")
    assert r.returncode == 0, r.stdout + r.stderr
    assert verdicts(r.stdout) == {"127.0.0.1": "OK", "localhost": "OK"}
    assert "preflight passed" in r.stdout
    assert "WARN" not in r.stdout  # SmolLM2's plain caches verify drafts
    assert f"smollm2-135m generator v{PACKAGED_VERSION}" in r.stdout  # the default model
    assert stub_log(env) == ""  # local hosts are checked without ssh


def test_check_names_a_missing_model_path(env):
    missing = Path(env["_root"]) / "no-such-model"
    r = launch(env, "check", HOSTS="127.0.0.1", MODEL=str(missing))
    assert r.returncode == 1
    assert verdicts(r.stdout) == {"127.0.0.1": "FAULT (1)"}
    assert f"FAULT 127.0.0.1: MODEL path {missing} does not exist" in r.stdout
    assert "preflight failed: 1 fault(s)" in r.stdout


def test_check_a_model_folder_without_config_json(env):
    folder = Path(env["_root"]) / "model"
    folder.mkdir()
    r = launch(env, "check", HOSTS="127.0.0.1", MODEL=str(folder))
    assert r.returncode == 1
    assert f"MODEL path {folder} has no config.json" in r.stdout


def test_check_goes_over_ssh_for_remote_hosts_and_names_an_unreachable_one(env):
    r = launch(env, "check", HOSTS="127.0.0.1,mac-2.local,unreachable.local")
    assert r.returncode == 1, r.stdout + r.stderr
    assert verdicts(r.stdout) == {"127.0.0.1": "OK", "mac-2.local": "OK", "unreachable.local": "FAULT (1)"}
    assert "FAULT unreachable.local: ssh unreachable.local failed (exit 255): ssh: connect to host" in r.stdout
    calls = stub_log(env)
    assert "BatchMode=yes" in calls and " mac-2.local " in calls and "127.0.0.1" not in calls


def test_check_jaccl_hostfile_matrix_and_port_states(env):
    (Path(env["_bin"]) / "ibv_devinfo").write_text(IBV_STUB)
    (Path(env["_bin"]) / "ibv_devinfo").chmod(0o755)
    hostfile = Path(env["_root"]) / "hosts.json"

    def check(rdma: list) -> subprocess.CompletedProcess:
        hosts = [{"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": row} for row in rdma]
        hostfile.write_text(json.dumps({"backend": "jaccl", "hosts": hosts}))
        return launch(env, "check", BACKEND="jaccl", HOSTFILE=str(hostfile))

    r = check([[None, "rdma_en3"], ["rdma_en3", None]])
    assert r.returncode == 0, r.stdout + r.stderr
    r = check([[None, "rdma_en3"], ["rdma_en4", None]])
    assert r.returncode == 1
    assert "FAULT 127.0.0.1: RDMA device rdma_en4 is PORT_DOWN, not PORT_ACTIVE" in r.stdout
    r = check([[None, "rdma_en3"], ["rdma_en3", "rdma_en3"], [None]])
    assert r.returncode == 1
    assert "FAULT hostfile: hostfile rdma row of rank 0 must list 3 entries" in r.stdout
    r = check([[None, "rdma_en3"], ["rdma_en3", "rdma_en3"]])
    assert "FAULT hostfile: hostfile rdma[1][1] must be null" in r.stdout


def test_sync_copies_to_remote_hosts_only(env):
    r = launch(env, "sync", HOSTS="127.0.0.1,127.0.0.1")
    assert r.returncode == 0 and "nothing to copy" in r.stdout
    assert stub_log(env) == ""

    r = launch(env, "sync", HOSTS="127.0.0.1,mac-2.local", STUB_SSH_EXEC="0")
    assert r.returncode == 0, r.stdout + r.stderr
    calls = stub_log(env).splitlines()
    rsyncs = [c for c in calls if c.startswith("rsync ")]
    assert len(rsyncs) == 1
    assert rsyncs[0].endswith(f" {REPO}/ mac-2.local:{REPO}/")
    for excluded in (".venv/", ".git/", "__pycache__/"):
        assert f"--exclude={excluded}" in rsyncs[0]
    assert "--exclude=.env" not in rsyncs[0]  # .env travels with the project
    assert any(c.startswith("ssh ") and c.endswith("./launch.sh setup --runtime") for c in calls)


def test_start_status_logs_and_stop(env):
    log_dir = Path(env["LOG_DIR"])
    try:
        r = launch(env, "start", HOSTS="127.0.0.1", timeout=240)
        assert r.returncode == 0, r.stdout + r.stderr
        url = f"http://127.0.0.1:{env['API_PORT']}"
        body = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        req = urllib.request.Request(url + "/v1/chat/completions", body.encode(), {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            answer = json.load(resp)
        request_id = answer["id"]
        assert answer["model"] == "smollm2-135m"  # what a fresh clone serves: the real model
        r = launch(env, "status")
        assert r.returncode == 0, r.stdout + r.stderr
        assert re.search(r"rank 0 +\S+ +pid \d+ +step \d+ +reported [\d.]+s ago +memory [\d.]+ [MG]iB", r.stdout), r.stdout
        # the API writes (and rotates) api.log itself: one line per request, with tokens and TTFT
        line = next(x for x in (log_dir / "api.log").read_text().splitlines() if request_id in x)
        assert re.search(rf"{request_id} POST /v1/chat/completions 200 prompt_tokens=\d+ completion_tokens=4 "
                         r"ttft=[\d.]+s duration=[\d.]+s", line), line
        assert "starting API" in (log_dir / "api.console.log").read_text()
        assert "starting API" not in (log_dir / "api.log").read_text()
    finally:
        r = launch(env, "stop", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert launch(env, "status").returncode == 3


# -- a broken model folder: one sentence naming the file, at check, at start and in every rank's log ----------


def broken_copy(demo_tiny: Path, root: str, breakage: str) -> Path:
    """The demo model with one thing broken (or none: "sound")."""
    folder = Path(root) / breakage
    shutil.copytree(demo_tiny, folder)
    config = json.loads((folder / "config.json").read_text())
    if breakage == "unknown-type":
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "qwen9_turbo"}))
    elif breakage == "missing-shard":
        (folder / "model.safetensors").rename(folder / "model-00001-of-00002.safetensors")
        names = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
        (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict(zip("ab", names))}))
    elif breakage == "broken-tokenizer":
        (folder / "tokenizer.json").write_text((folder / "tokenizer.json").read_text()[:-40])
    elif breakage == "wider-config":  # hidden_size changed after the weights were made
        (folder / "config.json").write_text(json.dumps({**config, "hidden_size": 2 * config["hidden_size"]}))
    return folder


@pytest.mark.parametrize(("breakage", "sentence"), [
    ("unknown-type", "{f}/config.json names model_type 'qwen9_turbo', which mlx-lm"),
    ("missing-shard", "{f}/model-00002-of-00002.safetensors, named in {f}/model.safetensors.index.json, is missing"),
    ("broken-tokenizer", "{f}/tokenizer.json is not valid JSON ("),
])
def test_check_and_start_name_the_file_of_a_broken_model_folder(env, demo_tiny, breakage, sentence):
    folder = broken_copy(demo_tiny, env["_root"], breakage)
    sentence = sentence.format(f=folder)
    r = launch(env, "check", HOSTS="127.0.0.1", MODEL=str(folder))
    assert r.returncode == 1
    assert f"FAULT 127.0.0.1: {sentence}" in r.stdout
    # start refuses it before any rank loads: the sentence is its whole answer
    r = launch(env, "start", HOSTS="127.0.0.1", MODEL=str(folder))
    assert r.returncode == 1
    assert r.stderr.startswith(f"launch.sh: {sentence}") and len(r.stderr.splitlines()) == 1, r.stderr
    assert not (Path(env["_root"]) / "logs" / "engine.log").exists()


@pytest.mark.parametrize("hosts", ["127.0.0.1", "127.0.0.1,127.0.0.1"])
def test_weights_that_do_not_fit_config_end_every_rank_with_the_sentence_start_prints(env, demo_tiny, hosts):
    folder = broken_copy(demo_tiny, env["_root"], "wider-config")
    sentence = (f"{folder}/model.safetensors does not fit {folder}/config.json: model.embed_tokens.weight has shape "
                "(1024, 64) where the qwen3 model that config.json describes expects (1024, 128)")
    assert launch(env, "check", HOSTS=hosts, MODEL=str(folder)).returncode == 0  # only loading can tell
    try:
        r = launch(env, "start", HOSTS=hosts, MODEL=str(folder), timeout=240)
    finally:
        launch(env, "stop")  # a start that served such weights must not outlive the test
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert re.match(rf"the engine did not start: rank [01] could not load the model: {re.escape(sentence)}", last), last
    log = (Path(env["_root"]) / "logs" / "engine.log").read_text()
    errors = [line for line in log.splitlines() if " ERROR " in line]
    ranks = hosts.count(",") + 1
    assert len(errors) == ranks and all(f"rank{i} ERROR engine: {sentence}" in log for i in range(ranks)), log
    assert "Traceback" not in log


def test_restarts_refuse_a_model_folder_broken_meanwhile_and_the_engine_serves_on(env, demo_tiny):
    folder = broken_copy(demo_tiny, env["_root"], "sound")
    run = {"HOSTS": "127.0.0.1", "MODEL": str(folder)}
    try:
        r = launch(env, "start", timeout=240, **run)
        assert r.returncode == 0, r.stdout + r.stderr
        (folder / "tokenizer.json").write_text("{")
        for verb in ("restart-engine", "restart"):
            r = launch(env, verb, **run)
            assert r.returncode == 1
            assert r.stderr.startswith(f"launch.sh: {folder}/tokenizer.json is not valid JSON"), r.stderr
            assert launch(env, "status", **run).returncode == 0  # the running engine was not stopped
    finally:
        launch(env, "stop", **run)


def test_check_says_when_rank_0s_address_is_not_this_machine():
    """check listens where the other ranks will dial rank 0 (hosts[0].ips[0]); an address that is not this
    machine's, no address at all, or a port an engine already holds each say so instead of failing the dial."""
    from ops.macfacts import reach
    from ops.rank0_ports import listening

    with listening(["192.0.2.1"], (free_port(),)) as (addresses, faults):  # TEST-NET-1: nobody's
        assert addresses == () and faults[0].startswith("hosts[0].ips[0] 192.0.2.1 of HOSTFILE is no address of "
                                                        "this machine: run ./launch.sh on the hostfile's first host")
    with listening([], (free_port(),)) as (addresses, faults):
        assert faults[0].startswith("hosts[0] of HOSTFILE lists no ips")
    held, free = free_port(), free_port()
    with listening(["127.0.0.1"], (held,)), listening(["127.0.0.1"], (held, free)) as (addresses, faults):
        assert addresses == (f"127.0.0.1:{free}",) and faults == []  # the held port is never dialled
        assert reach(addresses[0]) == "ok"
