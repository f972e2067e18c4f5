"""The API keys a gateway accepts: API_KEY, and those of API_KEYS_FILE.

Here rather than in api/, so that ops can make the same check before it stops or starts an API.
"""

from __future__ import annotations

from pathlib import Path

from config.settings import REPO_ROOT, ConfigError, Settings


def read_keys_file(path: str | Path) -> list[str]:
    """The keys of an API_KEYS_FILE: one per line; blank lines and lines starting with # are skipped.

    Read by the API, and by ops before it starts one (the engine's ranks, on other hosts, never need it).
    """
    resolved = Path(path).expanduser()
    if not resolved.is_absolute():
        resolved = REPO_ROOT / resolved
    try:
        text = resolved.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"API_KEYS_FILE={str(path)!r} cannot be read ({exc}): give a file with one API key "
                          "per line") from None
    keys = [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]
    if not keys:
        raise ConfigError(f"API_KEYS_FILE={str(path)!r} holds no key: put one API key per line")
    return keys


def api_keys(settings: Settings) -> list[str]:
    """Every accepted key: API_KEY, then those of API_KEYS_FILE."""
    keys = [settings.API_KEY] if settings.API_KEY else []
    if settings.API_KEYS_FILE:
        keys += read_keys_file(settings.API_KEYS_FILE)
    return keys
