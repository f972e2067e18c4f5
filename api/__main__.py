"""`python -m api`: serve the OpenAI API on API_HOST:API_PORT in front of the engine socket."""

from __future__ import annotations

import argparse
import logging
import logging.handlers
import sys
from pathlib import Path

from api.app import create_app
from api.serve import listen, server
from config import ConfigError, load_settings
from config.keys import api_keys
from ipc import raise_open_file_limit

# --log-file rotation: api.log plus this many rotated copies of at most LOG_MAX_BYTES each.
LOG_MAX_BYTES = 20 * 1024 * 1024
LOG_BACKUPS = 3


def main() -> int:
    parser = argparse.ArgumentParser(
        prog="python -m api", description=__doc__.splitlines()[0], epilog="Configured by the environment and .env (see .env.example)."
    )
    parser.add_argument("--log-file", help="log here, rotated by size, instead of stderr (launch.sh: LOG_DIR/api.log)")
    parser.add_argument("--take-over", action="store_true",
                        help="share API_PORT with the API this one replaces (it stops accepting and drains)")
    parser.add_argument("--ready-file", type=Path, help="write our pid here once listening (launch.sh restart-api)")
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
    raise_open_file_limit()  # a socket per client and per stream: macOS would allow 256
    logging.getLogger("api").info(
        "serving %s on http://%s:%d (engine socket %s%s)",
        settings.model_name,
        settings.API_HOST,
        settings.API_PORT,
        settings.socket_path,
        ", API key required" if settings.API_KEY or settings.API_KEYS_FILE or settings.ADMIN_API_KEYS_FILE else "",
    )
    try:
        sock = listen(settings.API_HOST, settings.API_PORT, take_over=args.take_over)
    except OSError as exc:
        logging.getLogger("api").error("cannot listen on %s:%d: %s (set API_HOST/API_PORT, or stop what uses it)",
                                       settings.API_HOST, settings.API_PORT, exc.strerror or exc)
        return 1
    server(create_app(settings), settings, ready_file=args.ready_file).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
