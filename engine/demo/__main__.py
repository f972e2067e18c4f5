"""`python -m engine.demo`: generate a demo model (if its cache lacks it) and print its path."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import engine.demo
from engine.demo import DEFAULT_CACHE_DIR, DEMO_MODELS, MARKER_FILE, ensure_demo_model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.demo", description=engine.demo.__doc__.splitlines()[0])
    parser.add_argument("--size", choices=DEMO_MODELS, default=DEMO_MODELS[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args(argv)
    path = ensure_demo_model(args.size, args.cache_dir.expanduser())
    info = json.loads((path / MARKER_FILE).read_text(encoding="utf-8"))
    # stdout is only the path, for scripts; the summary goes to stderr.
    print(f"demo-{info['name']}: {info['parameters']:,} parameters, vocab {info['vocab_size']}", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
