"""`python -m config`: print the resolved settings as shell assignments (launch.sh evals them)."""

import shlex
import sys

from config.settings import ConfigError, load_settings


def main() -> int:
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    for key, value in sorted(settings.as_env().items()):
        print(f"{key}={shlex.quote(value)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
