"""Settings: environment > `.env` > defaults, validated at start with messages that name the variable."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from dotenv import dotenv_values
from msgspec import Meta

REPO_ROOT = Path(__file__).resolve().parent.parent

# macOS limits a Unix socket path to 104 bytes including the NUL; Linux to 108.
MAX_SOCKET_PATH = 100

Port = Annotated[int, Meta(ge=1, le=65535)]
Positive = Annotated[int, Meta(ge=1)]
Seconds = Annotated[float, Meta(gt=0)]


# Variables that once meant something: a `.env` naming one still loads (the value is ignored).
RETIRED = frozenset({
    "IDLE_TICK_MS",  # idle ranks sleep until rank 0 wakes them; there is no idle tick any more
})


class ConfigError(Exception):
    """A setting with a bad value: the message names the variable, the value and what is accepted."""


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every knob of mlx-cluster-serve; documented in .env.example."""

    MODEL: str = "demo-tiny"
    SERVED_MODEL_NAME: str = ""
    MODEL_CACHE_DIR: str = "~/.cache/mlx-cluster-serve"
    API_HOST: str = "127.0.0.1"
    API_PORT: Port = 8000
    API_KEY: str = ""
    API_KEYS_FILE: str = ""
    PROTECT_OPS_ROUTES: bool = True
    HTTP_HEADER_TIMEOUT: Seconds = 10.0
    HTTP_KEEP_ALIVE_TIMEOUT: Seconds = 5.0
    MAX_CONNECTIONS: Positive = 512
    API_DRAIN_TIMEOUT: Seconds = 30.0
    SOCKET_PATH: str = ""
    RUN_DIR: str = "run"
    LOG_DIR: str = "logs"
    LOG_LEVEL: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    HOSTS: str = "127.0.0.1"
    HOSTFILE: str = ""
    BACKEND: Literal["ring", "jaccl", "mpi"] = "ring"
    RING_PORT: Port = 32323
    MAX_TOKENS_DEFAULT: Positive = 512
    MAX_TOKENS_LIMIT: Positive = 32768
    REQUEST_TIMEOUT: Seconds = 600.0
    MAX_BATCH: Positive = 32
    MAX_QUEUE: Positive = 256
    PREFILL_TOKENS_PER_STEP: Annotated[int, Meta(ge=16)] = 512
    # -1: a quarter of the memory the smallest rank has left after loading its weights; 0: no prefix cache
    PROMPT_CACHE_BYTES: Annotated[int, Meta(ge=-1)] = -1
    # KV bytes per rank for running sequences and the prefix cache together; -1: half of the memory the
    # smallest rank has left after loading its weights; 0: no limit
    KV_MEMORY_BYTES: Annotated[int, Meta(ge=-1)] = -1
    PLAN_BUFFER_BYTES: Annotated[int, Meta(ge=256, le=1 << 24)] = 4096
    WATCHDOG_TIMEOUT: Seconds = 30.0
    HEALTH_STALL_SECONDS: Seconds = 10.0
    ENGINE_RESTART: Literal["never", "always"] = "never"
    DRAIN_TIMEOUT: Seconds = 10.0
    ENGINE_START_TIMEOUT: Seconds = 600.0
    MAX_FRAME_BYTES: Annotated[int, Meta(ge=1024)] = 8 * 1024 * 1024
    MAX_REQUEST_BYTES: Annotated[int, Meta(ge=1024)] = 4 * 1024 * 1024
    MAX_MESSAGES: Positive = 2048
    BODY_READ_TIMEOUT: Seconds = 30.0
    CORS_ORIGINS: str = ""
    OUTPUT_BUFFER_EVENTS: Annotated[int, Meta(ge=16)] = 4096

    # Derived values, resolved against the repository root.
    @property
    def run_dir(self) -> Path:
        return _resolve(self.RUN_DIR)

    @property
    def log_dir(self) -> Path:
        return _resolve(self.LOG_DIR)

    @property
    def socket_path(self) -> Path:
        return _resolve(self.SOCKET_PATH) if self.SOCKET_PATH else self.run_dir / "engine.sock"

    @property
    def model_cache_dir(self) -> Path:
        return _resolve(self.MODEL_CACHE_DIR)

    @property
    def hosts(self) -> list[str]:
        return [h.strip() for h in self.HOSTS.split(",") if h.strip()]

    @property
    def cors_origins(self) -> list[str]:
        """Origins a browser may call the API from; empty: CORS stays off."""
        return [o.strip().rstrip("/") for o in self.CORS_ORIGINS.split(",") if o.strip()]

    @property
    def ranks(self) -> int:
        """Ranks the engine runs (from HOSTS; a HOSTFILE's count is known only to mlx.launch)."""
        return len(self.hosts)

    @property
    def model_name(self) -> str:
        """The id clients see in /v1/models."""
        if self.SERVED_MODEL_NAME:
            return self.SERVED_MODEL_NAME
        return self.MODEL.rstrip("/").rsplit("/", 1)[-1] if self.MODEL.startswith(("/", ".", "~")) else self.MODEL

    def as_env(self) -> dict[str, str]:
        """Resolved values as strings, for launch.sh and child processes."""
        out = {name: _to_str(getattr(self, name)) for name in self.__struct_fields__}
        out.update(
            RUN_DIR=str(self.run_dir),
            LOG_DIR=str(self.log_dir),
            SOCKET_PATH=str(self.socket_path),
            MODEL_CACHE_DIR=str(self.model_cache_dir),
            SERVED_MODEL_NAME=self.model_name,
            RANKS=str(self.ranks),
        )
        return out


HINTS = {
    "API_PORT": "an integer from 1 to 65535",
    "RING_PORT": "an integer from 1 to 65535",
    "LOG_LEVEL": "one of DEBUG, INFO, WARNING, ERROR",
    "BACKEND": "one of ring, jaccl, mpi",
    "MAX_TOKENS_DEFAULT": "a positive integer",
    "MAX_TOKENS_LIMIT": "a positive integer",
    "MAX_BATCH": "a positive integer",
    "MAX_QUEUE": "a positive integer",
    "REQUEST_TIMEOUT": "a number of seconds > 0",
    "WATCHDOG_TIMEOUT": "a number of seconds > 0",
    "HEALTH_STALL_SECONDS": "a number of seconds > 0",
    "DRAIN_TIMEOUT": "a number of seconds > 0",
    "ENGINE_RESTART": "one of never, always",
    "PROTECT_OPS_ROUTES": "true or false",
    "HTTP_HEADER_TIMEOUT": "a number of seconds > 0",
    "HTTP_KEEP_ALIVE_TIMEOUT": "a number of seconds > 0",
    "MAX_CONNECTIONS": "a positive integer",
    "API_DRAIN_TIMEOUT": "a number of seconds > 0",
    "MAX_MESSAGES": "a positive integer",
    "ENGINE_START_TIMEOUT": "a number of seconds > 0",
    "PREFILL_TOKENS_PER_STEP": "an integer >= 16",
    "PROMPT_CACHE_BYTES": "an integer of bytes (0 turns the prefix cache off, -1 sizes it from memory)",
    "KV_MEMORY_BYTES": "an integer of bytes (0: no limit, -1 sizes it from memory)",
    "PLAN_BUFFER_BYTES": "an integer of bytes from 256 to 16777216",
    "MAX_FRAME_BYTES": "an integer of bytes >= 1024",
    "MAX_REQUEST_BYTES": "an integer of bytes >= 1024",
    "BODY_READ_TIMEOUT": "a number of seconds > 0",
}

_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\-\[\]]+$")
# scheme://host[:port], as a browser sends it in the Origin header
_ORIGIN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://[^/\s?#]+$")


def _resolve(p: str) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else REPO_ROOT / path


def _to_str(v: object) -> str:
    return str(v)


def load_settings(
    environ: Mapping[str, str] | None = None, env_file: str | Path | None = None
) -> Settings:
    """Build Settings from environ (default os.environ) over env_file (default REPO_ROOT/.env)."""
    environ = os.environ if environ is None else environ
    if env_file is None:
        # ENV_FILE points elsewhere (tests use an empty file so a developer's .env can't leak in).
        env_file = environ.get("ENV_FILE") or REPO_ROOT / ".env"
    env_file = Path(env_file)
    fields = set(Settings.__struct_fields__)
    raw: dict[str, str] = {}
    if env_file.is_file():
        for key, value in dotenv_values(env_file).items():
            if key in RETIRED:
                continue
            if key not in fields:
                raise ConfigError(
                    f"{env_file}: unknown variable {key}; the accepted ones are listed in .env.example"
                )
            if value is not None:
                raw[key] = value
    raw.update({k: v for k, v in environ.items() if k in fields})
    raw = {k: v.strip() for k, v in raw.items()}
    try:
        settings = msgspec.convert(raw, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(exc, raw)) from None
    _check(settings)
    return settings


def _explain(exc: msgspec.ValidationError, raw: Mapping[str, str]) -> str:
    match = re.search(r"at `\$\.(\w+)`", str(exc))
    if not match:
        return f"invalid settings: {exc}"
    name = match.group(1)
    accepted = HINTS.get(name, str(exc).split(" - at ")[0])
    return f"{name}={raw.get(name, '')!r} is not valid: expected {accepted}"


def _check(s: Settings) -> None:
    if not s.MODEL:
        raise ConfigError("MODEL is empty: set it to demo-tiny, demo-small, a local model folder or a Hugging Face repo id")
    if not s.hosts and not s.HOSTFILE:
        raise ConfigError(f"HOSTS={s.HOSTS!r} names no host: give comma-separated hosts, e.g. 127.0.0.1 or 10.0.0.1,10.0.0.2")
    for host in s.hosts:
        if not _HOST_RE.match(host):
            raise ConfigError(f"HOSTS={s.HOSTS!r} is not valid: {host!r} is not a host name or IP address")
    if s.HOSTFILE and not _resolve(s.HOSTFILE).is_file():
        raise ConfigError(f"HOSTFILE={s.HOSTFILE!r} does not exist: give the path of an mlx.launch hostfile (JSON)")
    if s.BACKEND == "jaccl" and not s.HOSTFILE:
        raise ConfigError("BACKEND=jaccl needs HOSTFILE: a hostfile with the rdma devices of every host (see README)")
    if len(str(s.socket_path)) > MAX_SOCKET_PATH:
        raise ConfigError(
            f"SOCKET_PATH={str(s.socket_path)!r} is {len(str(s.socket_path))} bytes long; Unix sockets allow "
            f"at most {MAX_SOCKET_PATH}: set SOCKET_PATH (or RUN_DIR) to a shorter path"
        )
    for origin in s.cors_origins:
        if origin != "*" and not _ORIGIN_RE.match(origin):
            raise ConfigError(f"CORS_ORIGINS={s.CORS_ORIGINS!r} is not valid: {origin!r} is not an origin; give "
                              "comma-separated origins such as https://app.example,http://localhost:3000, or *")
    if s.MAX_TOKENS_DEFAULT > s.MAX_TOKENS_LIMIT:
        raise ConfigError(
            f"MAX_TOKENS_DEFAULT={s.MAX_TOKENS_DEFAULT} exceeds MAX_TOKENS_LIMIT={s.MAX_TOKENS_LIMIT}: lower it or raise the limit"
        )
