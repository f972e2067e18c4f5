"""`./launch.sh download` of a sharded LFS repo through the Hub stand-in (tests/hubstub.py): bytes moved, exit
code and verdict of a first run and a re-run, for any checkout (ROOT: this one, or another branch's worktree
to compare). The repo is the qwen3 zoo model as the hub holds one: 3 LFS shards with their index, config and
tokenizer files, .gitattributes, README.md, and (--copies) tokenizer.json again under original/.

    .venv/bin/python -m bench.hub_download [--root /path/to/other/checkout] [--copies]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
from pathlib import Path

from engine.zoo import ensure_zoo_model
from tests.hub_model import hub_shaped
from tests.hubstub import HubStub

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=REPO, help="the checkout whose launch.sh runs (default: this one)")
    p.add_argument("--copies", action="store_true", help="tokenizer.json also under original/ (identical files)")
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-hub-"))
    copies = ("original/tokenizer.json",) if args.copies else ()
    folder = hub_shaped(ensure_zoo_model("qwen3", tmp / "zoo"), tmp / "repo", copies=copies)
    with HubStub() as hub:
        stub = hub.add("org/shaped", folder, lfs=("tokenizer.json", *copies))
        unique = sum({f.sha256: f.size for f in stub.files.values()}.values())
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))} | {
            "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "HUB_CACHE": str(tmp / "hub"), "RUN_DIR": str(tmp / "run"), "LOG_DIR": str(tmp / "logs"),
            "HOSTS": "127.0.0.1", "HUB_CACHE_PER_RANK": ""}
        print(f"org/shaped: {len(stub.files)} files, {unique} distinct bytes; {args.root}")
        for run in ("first run", "re-run"):
            hub.reset()
            r = subprocess.run([str(args.root / "launch.sh"), "download", "org/shaped"], cwd=args.root, env=env,
                               capture_output=True, text=True, timeout=600)
            last = ([line for line in r.stderr.splitlines() if line.strip()] or [""])[-1]
            manifest = any((tmp / "hub").rglob("mcs-manifests/*.json"))
            print(f"{run}: exit {r.returncode}, {hub.served.total} bytes moved, manifest {'yes' if manifest else 'no'}"
                  f"; {last[:200]}")


if __name__ == "__main__":
    main()
