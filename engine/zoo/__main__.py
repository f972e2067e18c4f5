"""`python -m engine.zoo`: generate zoo models (where the cache lacks them) and print their paths."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import engine.zoo
from engine.modelgen.store import DEFAULT_CACHE_DIR
from engine.zoo import MARKER_FILE, PREFIX, SERVED_MODELS, ZOO_MODELS, ensure_zoo_model


def _name(text: str) -> str:
    name = text.removeprefix(PREFIX)
    if name not in SERVED_MODELS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a zoo model; choose from "
                                         + ", ".join(PREFIX + n for n in SERVED_MODELS))
    return name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.zoo", description=engine.zoo.__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", type=_name, metavar="NAME",
                        help="zoo models, with or without the zoo- prefix (default: all of them)")
    parser.add_argument("--list", action="store_true", help="print the zoo's model names and exit")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(PREFIX + n for n in ZOO_MODELS))
        return 0
    for name in args.names or ZOO_MODELS:
        path = ensure_zoo_model(name, args.cache_dir.expanduser())
        info = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
        # stdout is only the paths, for scripts; the summaries go to stderr.
        print(f"{PREFIX}{name}: {info['model_type']}, {info['parameters']:,} parameters", file=sys.stderr)
        print(path, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
