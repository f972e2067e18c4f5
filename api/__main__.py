"""`python -m api`: serve the OpenAI API on API_HOST:API_PORT in front of the engine socket."""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from api.app import create_app
from config import ConfigError, load_settings

# On TERM, streams still running after this long are cut so a restart never hangs on them.
GRACEFUL_SHUTDOWN_SECONDS = 10


def main() -> int:
    argparse.ArgumentParser(
        prog="python -m api", description=__doc__.splitlines()[0], epilog="Configured by the environment and .env (see .env.example)."
    ).parse_args()
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(
        level=settings.LOG_LEVEL,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
    )
    logging.getLogger("api").info(
        "serving %s on http://%s:%d (engine socket %s%s)",
        settings.model_name,
        settings.API_HOST,
        settings.API_PORT,
        settings.socket_path,
        ", API key required" if settings.API_KEY else "",
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
