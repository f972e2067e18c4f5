"""One typed Settings object, read from the environment after `.env`."""

from config.settings import REPO_ROOT, ConfigError, Settings, load_settings

__all__ = ["REPO_ROOT", "ConfigError", "Settings", "load_settings"]
