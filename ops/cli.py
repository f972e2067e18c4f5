"""The commands behind ./launch.sh (which only prepares .venv first), run by `python -m ops COMMAND`."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from config import ConfigError, load_settings
from ops import cluster
from ops.commands import Services
from ops.download import download
from ops.interrupt import Interrupted
from ops.layout import Die, Layout, say
from ops.models import models
from ops.status import status
from ops.switch import switch

USAGE = (Path(__file__).resolve().parent / "usage.txt").read_text()
COMMANDS = ("start", "stop", "status", "restart", "restart-api", "restart-engine", "logs", "check", "sync", "download",
            "models", "switch", "test")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="launch.sh", usage=argparse.SUPPRESS, description=USAGE,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        cmd = sub.add_parser(name, prog=f"launch.sh {name}")
        if name == "logs":
            cmd.add_argument("which", nargs="?", help="api, engine, or nothing (both)")
        if name == "download":
            cmd.add_argument("source", metavar="REPO_OR_FOLDER", help="a hub repo id (ORG/NAME) or a local folder")
            cmd.add_argument("--revision", help="a branch, tag or commit of the repo (default: main)")
        if name == "check":
            cmd.add_argument("--links", action="store_true", help="start every rank (no model), meet over the "
                             "plan channel as the engine does and measure every link")
        if name == "models":
            cmd.add_argument("--json", action="store_true", help="print the list as JSON")
        if name == "switch":
            cmd.add_argument("model", help="a Hugging Face repo id, a local folder, or a demo or zoo name")
            cmd.add_argument("--served-name", default="", help="the name clients use (default: from MODEL)")
    return p


def run(command: str, args: argparse.Namespace) -> int:
    try:
        settings = load_settings()
    except ConfigError as exc:
        print(f"configuration error: {exc}", file=sys.stderr)
        raise Die(2, "fix the setting above (in .env or the environment; .env.example describes every variable)") \
            from None
    if command == "check" and args.links:
        from ops.link_check import link_check

        return link_check(settings)
    if command == "check":
        return cluster.check(settings)
    if command == "sync":
        return cluster.sync(settings)
    if command == "download":
        return download(settings, args.source, args.revision)
    if command == "models":
        return models(settings, args.json)
    if command == "switch":
        return switch(settings, args.model, args.served_name)
    layout = Layout(settings)
    if command == "status":
        return status(layout)
    services = Services(layout)
    if command == "logs":
        return services.logs(args.which)
    return getattr(services, command.replace("-", "_"))()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["test"]:  # every argument after it is pytest's
        os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv[1:]])
    args = parser().parse_args(argv)
    try:
        return run(args.command, args)
    except Die as exc:
        print(f"launch.sh: {exc}", file=sys.stderr)
        return exc.code
    except (Interrupted, KeyboardInterrupt):
        # A signal where no step is left to undo (as a start or a restart-api ends, or before one began):
        # what ran is as each finished step left it; a traceback would only hide that.
        say("launch.sh: interrupted")
        return 130

