"""Settings: defaults, environment > `.env` > defaults, messages that name the variable, `python -m config`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from config import REPO_ROOT, ConfigError, Settings, load_settings

NO_ENV_FILE = Path("/nonexistent/.env")


def _settings(env: dict[str, str] | None = None, env_file: Path = NO_ENV_FILE) -> Settings:
    return load_settings(env or {}, env_file)


def test_defaults() -> None:
    s = _settings()
    assert s == Settings()
    assert s.MODEL == "smollm2-135m"  # a fresh clone serves a real model
    assert s.model_name == "smollm2-135m"
    assert (s.API_HOST, s.API_PORT) == ("127.0.0.1", 8000)
    assert s.BACKEND == "ring"
    assert s.hosts == ["127.0.0.1"] and s.ranks == 1
    assert s.run_dir == REPO_ROOT / "run"
    assert s.log_dir == REPO_ROOT / "logs"
    assert s.socket_path == REPO_ROOT / "run" / "engine.sock"


def test_environment_beats_env_file_beats_defaults(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("# comment\nAPI_PORT=9001\nMAX_BATCH=4\nLOG_LEVEL=DEBUG\n")
    s = _settings({"API_PORT": "9002", "PATH": "/usr/bin"}, env_file)
    assert s.API_PORT == 9002  # environment
    assert s.MAX_BATCH == 4  # .env
    assert s.LOG_LEVEL == "DEBUG"  # .env
    assert s.MAX_QUEUE == 256  # default


def test_values_are_converted_and_stripped(tmp_path: Path) -> None:
    s = _settings({"REQUEST_TIMEOUT": " 12.5 ", "HOSTS": "127.0.0.1, 127.0.0.1"})
    assert s.REQUEST_TIMEOUT == 12.5
    assert s.hosts == ["127.0.0.1", "127.0.0.1"] and s.ranks == 2


@pytest.mark.parametrize(
    ("name", "value", "accepted"),
    [
        ("API_PORT", "abc", "an integer from 1 to 65535"),
        ("API_PORT", "70000", "an integer from 1 to 65535"),
        ("BACKEND", "foo", "one of ring, jaccl, mpi"),
        ("MAX_BATCH", "0", "a positive integer"),
        ("LOG_LEVEL", "loud", "one of DEBUG, INFO, WARNING, ERROR"),
        # values the engine cannot work with: its own answers, its idle heartbeat, a slow step
        ("MAX_FRAME_BYTES", "1024", "an integer of bytes >= 65536"),
        ("HEALTH_STALL_SECONDS", "0.5", "a number of seconds >= 3"),
        ("WATCHDOG_TIMEOUT", "0.01", "a number of seconds >= 5"),
        ("SPECULATIVE", "eagle", "one of off, ngram, draft, mtp"),
        ("NUM_DRAFT_TOKENS", "0", "an integer from 1 to 16"),
    ],
)
def test_bad_value_names_variable_value_and_accepted(name: str, value: str, accepted: str) -> None:
    with pytest.raises(ConfigError) as info:
        _settings({name: value})
    message = str(info.value)
    assert name in message
    assert repr(value) in message
    assert accepted in message


def test_bad_value_in_env_file_is_reported_too(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("MAX_BATCH=0\n")
    with pytest.raises(ConfigError, match="MAX_BATCH='0'"):
        _settings({}, env_file)


def test_unknown_key_in_env_file_is_named(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("API_PORT=9000\nAPI_PROT=9001\n")
    with pytest.raises(ConfigError, match="API_PROT"):
        _settings({}, env_file)


@pytest.mark.parametrize("line", ['API_KEY="s3cret', "MAX_BATCH: 8", "MAX_BATCH 8", "export MAX_BATCH 8"])
def test_an_env_file_line_that_cannot_be_read_is_refused_by_line_not_dropped(tmp_path: Path, line: str) -> None:
    # Dropping it would start with the default: for API_KEY, an API open to anyone.
    env_file = tmp_path / ".env"
    env_file.write_text(f"API_PORT=9000\n  \n{line}\nMAX_QUEUE=4\n")
    with pytest.raises(ConfigError) as info:
        _settings({}, env_file)
    message = str(info.value)
    assert f"{env_file}, line 3" in message and "NAME=value" in message
    assert "s3cret" not in message


def test_an_env_file_line_with_a_colon_never_echoes_its_value(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("API_KEY:s3cret\n")
    with pytest.raises(ConfigError, match="API_KEY") as info:
        _settings({}, env_file)
    assert "s3cret" not in str(info.value)


def test_a_retired_setting_in_an_old_env_file_still_loads(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text("IDLE_TICK_MS=40\nMAX_BATCH=4\n")  # idle ranks sleep now; there is no tick to set
    assert _settings({}, env_file).MAX_BATCH == 4


def test_unknown_environment_variables_are_ignored() -> None:
    assert _settings({"API_PROT": "1", "HOME": "/root"}) == Settings()


def test_socket_path_too_long() -> None:
    long_path = "/tmp/" + "x" * 120 + "/engine.sock"
    with pytest.raises(ConfigError, match="SOCKET_PATH") as info:
        _settings({"SOCKET_PATH": long_path})
    assert "at most" in str(info.value)


def test_socket_path_length_counts_bytes_not_characters() -> None:
    # 67 characters, 117 bytes: the kernel counts bytes
    with pytest.raises(ConfigError, match="117 bytes"):
        _settings({"SOCKET_PATH": "/tmp/" + "é" * 50 + "/engine.sock"})


def test_run_dir_too_long_for_the_default_socket() -> None:
    with pytest.raises(ConfigError, match="RUN_DIR"):
        _settings({"RUN_DIR": "/tmp/" + "r" * 120})


@pytest.mark.parametrize(
    ("env", "fragment"),
    [
        ({"MODEL": ""}, "MODEL"),
        ({"HOSTS": " , "}, "HOSTS"),
        ({"HOSTS": "bad host!"}, "HOSTS"),
        ({"HOSTFILE": "/nonexistent/hosts.json"}, "HOSTFILE"),
        ({"BACKEND": "jaccl"}, "HOSTFILE"),
        ({"MAX_TOKENS_DEFAULT": "100", "MAX_TOKENS_LIMIT": "10"}, "MAX_TOKENS_LIMIT"),
        ({"API_HOST": "localhost:8000"}, "API_HOST='localhost:8000' is not valid"),
        ({"API_HOST": "http://127.0.0.1"}, "API_HOST"),
        ({"API_HOST": "bad host"}, "API_HOST"),
        ({"API_HOST": "[::1]"}, "API_HOST"),
        ({"RING_PORT": "65535", "HOSTS": "127.0.0.1,127.0.0.1"}, "RING_PORT=65535 is too high for 2 ranks"),
        ({"RING_PORT": "1"}, "RING_PORT=1 leaves no port for the doorbell, which listens on RING_PORT-1"),
        ({"SPECULATIVE": "draft"}, "SPECULATIVE=draft needs DRAFT_MODEL"),
        ({"SPECULATIVE": "draft", "DRAFT_MODEL": "  "}, "SPECULATIVE=draft needs DRAFT_MODEL"),
    ],
)
def test_cross_field_checks(env: dict[str, str], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        _settings(env)


def test_only_rank_0_needs_the_hostfile() -> None:
    # mlx.launch on rank 0 reads HOSTFILE; a remote rank gets the setting forwarded but holds no copy of the file
    env = {"HOSTFILE": "/nonexistent/hosts.json", "BACKEND": "jaccl"}
    assert _settings({**env, "MLX_RANK": "1"}).HOSTFILE == "/nonexistent/hosts.json"
    for rank0 in ({}, {"MLX_RANK": "0"}):
        with pytest.raises(ConfigError, match="HOSTFILE='/nonexistent/hosts.json' does not exist"):
            _settings({**env, **rank0})


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "mac-studio.local", "my_host", ""])
def test_api_host_takes_addresses_and_names(host: str) -> None:
    assert _settings({"API_HOST": host}).API_HOST == host


def test_as_env_resolves_derived_values() -> None:
    env = _settings({"MODEL": "/models/Qwen3-4B/", "HOSTS": "127.0.0.1,127.0.0.1", "RUN_DIR": "/tmp/r"}).as_env()
    assert set(Settings.__struct_fields__) <= set(env)
    assert env["SERVED_MODEL_NAME"] == "Qwen3-4B"
    assert env["RANKS"] == "2"
    assert env["RUN_DIR"] == "/tmp/r"
    assert env["SOCKET_PATH"] == "/tmp/r/engine.sock"


def _run_config(env: dict[str, str], shell: str | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if k not in Settings.__struct_fields__} | env
    command = [sys.executable, "-m", "config"]
    if shell is not None:
        # The exact pattern launch.sh uses: eval the assignments, then read them back.
        command = ["bash", "-c", f'set -eu; eval "$("$0" -m config)"; {shell}', sys.executable]
    return subprocess.run(command, cwd=REPO_ROOT, env=full_env, capture_output=True, text=True, timeout=60)


def test_python_m_config_prints_assignments_bash_can_eval() -> None:
    proc = _run_config(
        {"API_PORT": "8123", "SERVED_MODEL_NAME": "it's a \"name\" $HOME"},
        shell='printf "%s\\n" "$API_PORT" "$SERVED_MODEL_NAME" "$RANKS" "$SOCKET_PATH"',
    )
    assert proc.returncode == 0, proc.stderr
    port, name, ranks, socket_path = proc.stdout.splitlines()
    assert port == "8123"
    assert name == "it's a \"name\" $HOME"
    assert ranks == "1"
    assert socket_path.endswith("engine.sock") and socket_path.startswith("/")


def test_python_m_config_exits_2_with_the_message_on_bad_value() -> None:
    proc = _run_config({"API_PORT": "abc"})
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert "API_PORT='abc'" in proc.stderr
    assert "an integer from 1 to 65535" in proc.stderr


def test_env_example_lists_every_setting_with_its_default(tmp_path: Path) -> None:
    lines = (REPO_ROOT / ".env.example").read_text().splitlines()
    assignments = [line[2:] for line in lines if re.match(r"^# [A-Z][A-Z0-9_]*=", line)]
    documented = dict(a.split("=", 1) for a in assignments)
    assert sorted(documented) == sorted(Settings.__struct_fields__)
    defaults = Settings()
    for key, value in documented.items():
        assert value == str(getattr(defaults, key)), key
    # Uncommented, the example is a valid .env that changes nothing.
    env_file = tmp_path / ".env"
    env_file.write_text("\n".join(assignments) + "\n")
    assert _settings({}, env_file) == defaults
