"""What `./launch.sh models` and a running download or spreading left in RUN_DIR, for the dashboard.

RUN_DIR/models.json lists the models every host holds; RUN_DIR/transfer.json is the progress of the last
download or spreading (ops/progress.py writes it). Both come from other processes at any moment, so they
are read with the stdlib, bounded in size, and anything missing, broken or of the wrong shape becomes a
note on the page, never an error: a dashboard poll must not fail on a file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

MODELS_FILE = "models.json"
TRANSFER_FILE = "transfer.json"
MAX_BYTES = 4 * 2**20  # a listing of many hosts and models stays far below this
MAX_HOSTS = 64
MAX_MODELS = 500
# A transfer state not updated for this long belongs to a process that is gone.
TRANSFER_STALE_SECONDS = 30.0
_MODEL_FIELDS = {"repo": str, "commit": str, "revisions": list, "size": int, "total": int, "complete": bool,
                 "manifest": bool, "missing": list}


def _load(path: Path) -> tuple[Any, str]:
    """(the decoded JSON, "") or (None, why not)."""
    try:
        with path.open("rb") as f:
            data = f.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None, "absent"
    except OSError as exc:
        return None, f"unreadable ({exc.strerror or exc})"
    if len(data) > MAX_BYTES:
        return None, f"larger than {MAX_BYTES} bytes"
    try:
        return json.loads(data), ""
    except (ValueError, RecursionError) as exc:  # RecursionError: nested deeper than json's decoder goes
        return None, f"not JSON ({exc})"


def _model(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("repo"), str):
        return None
    out: dict[str, Any] = {}
    for name, kind in _MODEL_FIELDS.items():
        value = raw.get(name)
        out[name] = value if isinstance(value, kind) and not (kind is int and isinstance(value, bool)) else None
    out["missing"] = len(out["missing"]) if out["missing"] is not None else 0  # a count is what the page shows
    out["revisions"] = len(out["revisions"]) if out["revisions"] is not None else 0
    return out


def _host(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict) or not isinstance(raw.get("host"), str):
        return None
    ranks = raw.get("ranks")
    models = raw.get("models")
    return {"host": raw["host"],
            "ranks": [r for r in ranks if isinstance(r, int)] if isinstance(ranks, list) else [],
            "cache": raw.get("cache") if isinstance(raw.get("cache"), str) else "",
            "models": [m for m in map(_model, models[:MAX_MODELS]) if m] if isinstance(models, list) else []}


def read_models(run_dir: Path) -> dict[str, Any]:
    """The models on every host, as the last `./launch.sh models` saw them, or a note saying what to run."""
    doc, why = _load(run_dir / MODELS_FILE)
    if doc is None:
        hint = "run ./launch.sh models" if why == "absent" else f"{MODELS_FILE} is {why}: run ./launch.sh models"
        return {"available": False, "note": hint, "hosts": []}
    if not isinstance(doc, dict) or not isinstance(doc.get("hosts"), list):
        return {"available": False, "note": f"{MODELS_FILE} has an unexpected shape: run ./launch.sh models",
                "hosts": []}
    updated = doc.get("updated")
    return {"available": True, "note": "",
            "updated": updated if isinstance(updated, (int, float)) and not isinstance(updated, bool) else None,
            "served": doc.get("served") if isinstance(doc.get("served"), str) else "",
            "hosts": [h for h in map(_host, doc["hosts"][:MAX_HOSTS]) if h]}


def read_transfer(run_dir: Path, now: float | None = None) -> dict[str, Any] | None:
    """The last download or spreading's progress (None: no transfer recorded, or an unreadable file)."""
    doc, _ = _load(run_dir / TRANSFER_FILE)
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), str) or not isinstance(doc.get("phase"), str):
        return None
    out: dict[str, Any] = {"model": doc["model"], "phase": doc["phase"]}
    for name in ("bytes_done", "bytes_total", "rate", "started", "updated"):
        value = doc.get(name)
        out[name] = value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0
    for name in ("file", "error"):
        out[name] = doc.get(name) if isinstance(doc.get(name), str) else ""
    hosts = doc.get("hosts")
    out["hosts"] = [h for h in hosts if isinstance(h, str)][:MAX_HOSTS] if isinstance(hosts, list) else []
    age = (time.time() if now is None else now) - out["updated"]
    # a phase still under way whose writer stopped updating it: the process was killed or crashed
    out["stale"] = out["phase"] not in ("done", "failed") and age > TRANSFER_STALE_SECONDS
    return out
