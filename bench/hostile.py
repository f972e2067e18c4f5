"""The hostile-input properties, long: thousands of random examples against a real engine and API.

    .venv/bin/python -m bench.hostile                       # 2,000 examples per property, 1 rank
    .venv/bin/python -m bench.hostile --examples 500 --ranks 2

Runs tests/integration/test_hostile_engine.py with fresh randomness (CI runs a few dozen
derandomized examples of the same properties) and prints one row per property: examples drawn,
how many the engine refused or ran, and engine deaths (any death fails the property at once, and
hypothesis prints the shrunk example). Needs the test extras (`pip install -e '.[test]'`).
Exit 0 when every property held.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TEST = "tests/integration/test_hostile_engine.py"
PROPERTIES = {
    "socket messages": "test_any_socket_request_runs_or_gets_a_4xx_and_the_engine_serves_on",
    "HTTP chat bodies": "test_any_chat_body_runs_or_gets_a_4xx_and_the_engine_serves_on",
}
# hypothesis --hypothesis-show-statistics: "* 26.48%, Started " / "* 41.03%, 400 messages"
EVENT = re.compile(r"\*\s+([\d.]+)%, (\S+)")
PASSING = re.compile(r"(\d+) passing, (\d+) failing")


def run(name: str, test: str, examples: int, ranks: int) -> dict:
    env = dict(os.environ, HOSTILE_EXAMPLES=str(examples), HOSTILE_RANDOM="1", HOSTILE_RANKS=str(ranks))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"{TEST}::{test}",
                           "--hypothesis-show-statistics"], cwd=REPO, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    out = proc.stdout + proc.stderr
    shares: dict[str, float] = {}
    for share, outcome in EVENT.findall(out):
        kind = "refused" if outcome == "Error" or outcome[:1] == "4" else "ran" if outcome in ("Started", "200") else ""
        if kind:
            shares[kind] = shares.get(kind, 0.0) + float(share)
    passing = PASSING.search(out)
    tried = int(passing.group(1)) + int(passing.group(2)) if passing else 0
    deaths = out.count("ENGINE DIED")  # the property stops at its first failing example: 0 or 1
    return {"name": name, "tried": tried, "seconds": seconds, "ok": proc.returncode == 0, "deaths": deaths,
            "ran": shares.get("ran", 0.0), "refused": shares.get("refused", 0.0), "output": out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile", description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="examples per property (2000)")
    parser.add_argument("--ranks", type=int, default=1, help="engine ranks (1; 2 runs through mlx.launch)")
    args = parser.parse_args(argv)
    rows = [run(name, test, args.examples, args.ranks) for name, test in PROPERTIES.items()]
    print(f"\nhostile input, {args.ranks} rank(s), {args.examples} examples per property\n")
    print("| property | examples tried | ran | refused (4xx) | engine deaths | time | result |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['name']} | {r['tried']} | {r['ran']:.0f} % | {r['refused']:.0f} % | {r['deaths']} | "
              f"{r['seconds']:.0f} s | {'held' if r['ok'] else 'FAILED'} |")
    for r in rows:
        if not r["ok"]:
            print(f"\n---- {r['name']}: pytest output\n{r['output'][-6000:]}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
