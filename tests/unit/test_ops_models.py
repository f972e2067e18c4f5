"""`launch.sh models` and `switch` without a running engine: .env rewriting, the listing of every rank's cache,
and a switch refused for a model a rank lacks."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from dotenv import dotenv_values

from config.hub_cache import Manifest, ManifestFile, sha256_file, snapshot_folder, write_manifest
from config.settings import load_settings
from ops import envfile
from ops.hostprobe import model_facts
from ops.layout import Die
from ops.models import gather, render
from ops.switch import switch

REPO = Path(__file__).resolve().parents[2]
COMMITS = {"org/whole": "a" * 40, "org/partial": "b" * 40, "org/only0": "c" * 40}


# -- .env -----------------------------------------------------------------------------------------------------


ENV = """# my cluster
export MODEL=demo-tiny   # the small one
API_PORT=8001

SERVED_MODEL_NAME="old name"
API_KEY='multi
MODEL=inside-a-quoted-value
'
PIPELINE_LAYERS=20,12
"""


def test_env_rewrite_keeps_every_other_line_and_comment() -> None:
    out = envfile.rewrite(ENV, {"MODEL": "org/new@v2", "SERVED_MODEL_NAME": None, "PIPELINE_LAYERS": None})
    assert out == ("# my cluster\nexport MODEL=org/new@v2   # the small one\nAPI_PORT=8001\n\n"
                   "API_KEY='multi\nMODEL=inside-a-quoted-value\n'\n")
    values = dotenv_values(stream=io.StringIO(out))
    assert values["MODEL"] == "org/new@v2" and values["API_KEY"] == "multi\nMODEL=inside-a-quoted-value\n"
    assert "SERVED_MODEL_NAME" not in values and "PIPELINE_LAYERS" not in values


@pytest.mark.parametrize("value", ["a b", "x#y", "$HOME/m", 'say "hi"', "it's", "back\\slash'", "", "~/models/m"])
def test_env_values_read_back_unchanged(value: str) -> None:
    out = envfile.rewrite("A=1\n", {"SERVED_MODEL_NAME": value})
    assert dotenv_values(stream=io.StringIO(out)) == {"A": "1", "SERVED_MODEL_NAME": value}


def test_env_duplicates_collapse_to_one_line_and_a_missing_file_is_created(tmp_path: Path) -> None:
    assert envfile.rewrite("MODEL=a\nX=1\nMODEL=b\n", {"MODEL": "c"}) == "MODEL=c\nX=1\n"
    env = tmp_path / ".env"
    envfile.update(env, {"MODEL": "org/x", "SERVED_MODEL_NAME": None})
    assert env.read_text() == "MODEL=org/x\n" and env.stat().st_mode & 0o777 == 0o600
    env.chmod(0o640)
    envfile.update(env, {"SERVED_MODEL_NAME": "x"})
    assert env.read_text() == "MODEL=org/x\nSERVED_MODEL_NAME=x\n" and env.stat().st_mode & 0o777 == 0o640


# -- the cluster's caches ---------------------------------------------------------------------------------------


def lay_out(cache: Path, repo: str, files: dict[str, bytes], drop: tuple[str, ...] = ()) -> None:
    """A model as `download` leaves it (manifest last); the files in drop then go missing."""
    commit = COMMITS[repo]
    snap = snapshot_folder(cache, repo, commit)
    snap.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (snap / name).write_bytes(data)
    write_manifest(cache, Manifest(repo=repo, revision="main", commit=commit, files=tuple(
        ManifestFile(n, len(d), sha256_file(snap / n)) for n, d in files.items())))
    for name in drop:
        (snap / name).unlink()


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Two local ranks with a cache each: org/whole in both, org/partial missing a file on rank 1, org/only0 on
    rank 0 alone; and a generated demo model."""
    files = {"config.json": b"{}", "model.safetensors": b"w" * 1000}
    r0, r1 = tmp_path / "r0", tmp_path / "r1"
    for cache in (r0, r1):
        lay_out(cache, "org/whole", files)
    lay_out(r0, "org/partial", files)
    lay_out(r1, "org/partial", files, drop=("model.safetensors",))
    lay_out(r0, "org/only0", files)
    (tmp_path / "gen" / "demo-tiny-v3").mkdir(parents=True)
    (tmp_path / "gen" / "demo-tiny-v3" / "config.json").write_bytes(b"{}")
    env = tmp_path / "cluster.env"
    env.write_text("# kept\nMODEL=org/whole\n")
    monkeypatch.setenv("ENV_FILE", str(env))
    for key in ("MODEL", "SERVED_MODEL_NAME", "PIPELINE_LAYERS"):
        monkeypatch.delenv(key, raising=False)
    return load_settings({"HOSTS": "127.0.0.1,127.0.0.1", "HUB_CACHE_PER_RANK": f"{r0},{r1}", "MODEL": "org/whole",
                          "RUN_DIR": str(tmp_path / "run"), "SOCKET_PATH": "/tmp/mcs-test-none.sock",
                          "MODEL_CACHE_DIR": str(tmp_path / "gen")}, env_file="/nonexistent")


def test_models_lists_every_rank_cache_as_a_place(cluster) -> None:
    doc = gather(cluster)
    assert set(doc) >= {"updated", "served", "hosts", "generated"}
    assert (doc["served"], doc["engine"]) == ("org/whole", "down")
    assert [(e["host"], e["ranks"]) for e in doc["hosts"]] == [("127.0.0.1", [0]), ("127.0.0.1", [1])]
    held = {(e["ranks"][0], m["repo"]): m for e in doc["hosts"] for m in e["models"]}
    assert set(held) == {(0, "org/whole"), (1, "org/whole"), (0, "org/partial"), (1, "org/partial"), (0, "org/only0")}
    assert held[(1, "org/partial")]["complete"] is False and held[(1, "org/partial")]["missing"] == ["model.safetensors"]
    assert held[(0, "org/whole")]["total"] == 1002 and held[(0, "org/whole")]["revisions"] == ["main"]
    assert [g["name"] for g in doc["generated"]] == ["demo-tiny"]
    json.dumps(doc)  # the shape scripts and the dashboard read

    table = render(doc).splitlines()
    row = {line.split()[0]: line for line in table if line.startswith(("org/", "demo-"))}
    assert "yes" in row["org/whole"] and "127.0.0.1 rank 0, 127.0.0.1 rank 1" in row["org/whole"]
    assert row["org/whole"].endswith("<- MODEL")
    assert "no: 127.0.0.1 rank 1 lacks 1 file(s)" in row["org/partial"]
    assert "no: not on 127.0.0.1 rank 1" in row["org/only0"]
    assert "the engine is not running; MODEL=org/whole" in table


def test_models_command_writes_the_json_for_the_dashboard(cluster, capsys) -> None:
    from ops.models import models

    assert models(cluster, as_json=True) == 0
    printed = json.loads(capsys.readouterr().out)
    written = json.loads((cluster.run_dir / "models.json").read_text())
    assert printed["hosts"] == written["hosts"]


@pytest.mark.parametrize(("model", "said"), [
    ("org/only0", "127.0.0.1 (rank 1, cache {r1}) lacks it: run ./launch.sh download org/only0"),
    ("org/partial", "127.0.0.1 (rank 1, cache {r1}) holds it incomplete, 1 file(s) missing (model.safetensors): "
                    "run ./launch.sh download org/partial to finish it"),
])
def test_switch_refuses_a_model_a_rank_lacks_and_leaves_env_alone(cluster, model: str, said: str) -> None:
    env = Path(cluster.hub_cache(0)).parent / "cluster.env"
    with pytest.raises(Die) as refused:
        switch(cluster, model, "")
    assert said.format(r1=cluster.hub_cache(1)) in str(refused.value)
    assert "rank 0" not in str(refused.value)
    assert env.read_text() == "# kept\nMODEL=org/whole\n"


def test_switch_refuses_an_unknown_demo_name_and_a_folder_without_a_model(cluster, tmp_path: Path) -> None:
    with pytest.raises(Die, match="not a demo model: use one of demo-tiny"):
        switch(cluster, "demo-huge", "")
    with pytest.raises(Die, match="cannot switch to"):
        switch(cluster, str(tmp_path), "")


def test_switch_with_nothing_running_only_rewrites_env(cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = load_settings({**{k: v for k, v in cluster.as_env().items() if k in type(cluster).__struct_fields__},
                             "PARALLEL": "pipeline", "PIPELINE_LAYERS": "1,1"}, env_file="/nonexistent")
    # as ./launch.sh runs it: the settings come from the environment, which the switch reads again
    for key in ("HOSTS", "HUB_CACHE_PER_RANK", "RUN_DIR", "SOCKET_PATH", "MODEL_CACHE_DIR"):
        monkeypatch.setenv(key, cluster.as_env()[key])
    assert switch(cluster, "org/whole", "tiny") == 0
    env = Path(cluster.hub_cache(0)).parent / "cluster.env"
    assert env.read_text() == "# kept\nMODEL=org/whole\nSERVED_MODEL_NAME=tiny\n"


def test_check_names_a_model_missing_files_in_a_rank_cache(cluster) -> None:
    facts = model_facts("org/partial", REPO, [cluster.hub_cache(0), cluster.hub_cache(1)])
    assert not facts["ok"]
    assert facts["problem"] == (f"org/partial is incomplete in {cluster.hub_cache(1)}: 1 of 2 file(s) missing or short "
                                "(model.safetensors): run ./launch.sh download org/partial")
    # whole in both caches: the lookup passes, and the files' own check speaks (this config.json is a stand-in)
    whole = model_facts("org/whole", REPO, [cluster.hub_cache(0), cluster.hub_cache(1)])
    assert "has no model_type" in whole["problem"]


def test_the_remote_probe_lists_what_the_local_scan_does(cluster) -> None:
    # remote hosts run ops/hostprobe.py as a file (piped over ssh): the same listing, by path
    r = subprocess.run([sys.executable, str(REPO / "ops" / "hostprobe.py"), "--root", str(REPO), "--model", "x",
                        "--list-models", "--hub-cache", str(cluster.hub_cache(1))], capture_output=True, text=True,
                       timeout=60, check=True)
    listed = json.loads(r.stdout)["caches"][str(cluster.hub_cache(1))]
    local = next(e for e in gather(cluster)["hosts"] if e["ranks"] == [1])["models"]
    assert listed == local
