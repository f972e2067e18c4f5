"""`python -m ops COMMAND`: ops.cli, with a Ctrl-C during its imports (the first moments of every command)
ending it as one later does, with exit 130 and one line instead of a traceback."""

import sys


def entry() -> int:
    try:
        from ops.cli import main

        return main()
    except KeyboardInterrupt:
        print("launch.sh: interrupted", file=sys.stderr, flush=True)
        return 130


if __name__ == "__main__":
    sys.exit(entry())
