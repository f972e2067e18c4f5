"""`python -m api`: serve the OpenAI API on API_HOST:API_PORT in front of the engine socket."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys

import uvicorn

from api.app import create_app
from api.auth import api_keys
from config import ConfigError, load_settings

# On TERM, streams still running after this long are cut so a restart never hangs on them.
GRACEFUL_SHUTDOWN_SECONDS = 10
# --log-file rotation: api.log plus this many rotated copies of at most LOG_MAX_BYTES each.
LOG_MAX_BYTES = 20 * 1024 * 1024
LOG_BACKUPS = 3


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m api", description=__doc__.splitlines()[0], epilog="Configured by the environment and .env (see .env.example)."
    )
    parser.add_argument("--log-file", help="log here, rotated by size, instead of stderr (launch.sh: LOG_DIR/api.log)")
    args = parser.parse_args()
    try:
        settings = load_settings()
        api_keys(settings)  # reads API_KEYS_FILE now, so a bad one stops the start with its message
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    handler: logging.Handler = logging.StreamHandler(sys.stderr)
    if args.log_file:
        try:
            handler = logging.handlers.RotatingFileHandler(args.log_file, maxBytes=LOG_MAX_BYTES, backupCount=LOG_BACKUPS)
        except OSError as exc:
            print(f"cannot write the log file {args.log_file}: {exc}", file=sys.stderr)
            return 1
    logging.basicConfig(
        level=settings.LOG_LEVEL,
        handlers=[handler],
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    logging.getLogger("api").info(
        "serving %s on http://%s:%d (engine socket %s%s)",
        settings.model_name,
        settings.API_HOST,
        settings.API_PORT,
        settings.socket_path,
        ", API key required" if settings.API_KEY or settings.API_KEYS_FILE else "",
    )
    uvicorn.run(
        create_app(settings),
        host=settings.API_HOST,
        port=settings.API_PORT,
        log_config=None,
        log_level=settings.LOG_LEVEL.lower(),
        access_log=False,  # api.access logs one line per request, with tokens
        lifespan="off",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
