"""The API keys a gateway accepts: API_KEY, those of API_KEYS_FILE, and the operators' of ADMIN_API_KEYS_FILE.

Operators are a file of their own rather than a role written in the keys file: every existing keys file keeps
its meaning, no key can be misread as a role marker, and the operators' file may be kept apart (its own mode,
its own rotation).

Here rather than in api/, so that ops can make the same check before it stops or starts an API.
"""

from __future__ import annotations

from pathlib import Path

from config.settings import REPO_ROOT, ConfigError, Settings


def read_keys_file(path: str | Path, setting: str = "API_KEYS_FILE") -> list[str]:
    """The keys of an API_KEYS_FILE (or ADMIN_API_KEYS_FILE, the setting named in errors): one per line; blank
    lines and lines starting with # are skipped.

    Read by the API, and by ops before it starts one (the engine's ranks, on other hosts, never need it).
    """
    resolved = Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = REPO_ROOT / resolved
    try:
        text = resolved.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{setting}={str(path)!r} cannot be read ({exc}): give a file with one API key "
                          "per line") from None
    keys = [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]
    if not keys:
        raise ConfigError(f"{setting}={str(path)!r} holds no key: put one API key per line")
    return keys


def tenant_keys(settings: Settings) -> list[str]:
    """The clients' keys: API_KEY, then those of API_KEYS_FILE."""
    keys = [settings.API_KEY] if settings.API_KEY else []
    if settings.API_KEYS_FILE:
        keys += read_keys_file(settings.API_KEYS_FILE)
    return keys


def operator_keys(settings: Settings) -> list[str]:
    """The keys that read the dashboard, /metrics and /health/detail: ADMIN_API_KEYS_FILE's; without it, a
    gateway of one client key is one user's, who is its operator; several tenants without it have none."""
    if settings.ADMIN_API_KEYS_FILE:
        return read_keys_file(settings.ADMIN_API_KEYS_FILE, "ADMIN_API_KEYS_FILE")
    tenants = set(tenant_keys(settings))
    return list(tenants) if len(tenants) == 1 else []


def api_keys(settings: Settings) -> list[str]:
    """Every key accepted on /v1: the tenants', then the operators' (the dashboard's chat box sends the latter)."""
    return tenant_keys(settings) + (read_keys_file(settings.ADMIN_API_KEYS_FILE, "ADMIN_API_KEYS_FILE")
                                    if settings.ADMIN_API_KEYS_FILE else [])
