"""What a rank on another host gets: mlx.launch starts it over ssh with a script of its own making and none of
rank 0's environment. Here that script is made by mlx.launch's own code and run in an empty environment."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from mlx._distributed_utils.launch import RemoteProcess

from config import load_settings
from ops.engine_ctl import EngineCtl
from ops.layout import Layout

NO_ENV_FILE = Path("/nonexistent/.env")
PRINT_ENV = [sys.executable, "-c", "import json, os; print(json.dumps(dict(os.environ)))"]


def remote_environment(cmd: list[str]) -> dict[str, str]:
    """The environment a remote rank of `cmd` (an mlx.launch command line) starts with."""
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
