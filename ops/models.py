"""`./launch.sh models [--json]`: every model in the cache of every rank on every host, and which one is served.

A place is one cache folder on one host: local ranks with a folder each (HUB_CACHE_PER_RANK) are places of
their own. Local places are scanned here; a remote host answers through ops/hostprobe.py over ssh, which runs
config/hub_cache.py by path as `check` does. The document (`--json`, and RUN_DIR/models.json for the
dashboard) has a stable shape:

    {"updated": unix_time, "served": MODEL served now (the engine's, or MODEL while it is down),
     "engine": "up" | "down", "configured": MODEL as the settings say, "served_path": the engine's folder or "",
     "hosts": [{"host": str, "ranks": [int], "cache": str, "models": [CachedModel as a dict], "error": str}],
     "generated": [{"name": "demo-tiny", "version": int, "folder": str, "size": int}]}
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import json
import os
import re
import tempfile
import time
from pathlib import Path

from config import REPO_ROOT, Settings
from config.hub_cache import repo_of_folder, scan, split_model
from ops.cluster import Host, cluster_hosts, run_probe
from ops.layout import say
from ops.probe import engine_info

INFO_TIMEOUT = 2.0
MODELS_FILE = "models.json"
# the folders engine/demo and engine/zoo generate in MODEL_CACHE_DIR: demo-tiny-v3, zoo-qwen3-v2
_GENERATED = re.compile(r"^((?:demo|zoo)-.+)-v(\d+)$")


def gather(settings: Settings) -> dict:
    """The document above, for the cluster as settings describe it."""
    hosts, faults = cluster_hosts(settings)
    doc: dict = {"updated": int(time.time()), **served(settings), "hosts": [], "generated": generated(settings)}
    if not hosts:
        doc["hosts"] = [{"host": "hostfile", "ranks": [], "cache": "", "models": [], "error": "; ".join(faults)}]
        return doc
    with cf.ThreadPoolExecutor(len(hosts)) as pool:
        for entries in pool.map(lambda h: host_places(h, settings), hosts):
            doc["hosts"] += entries
    return doc


def host_places(host: Host, settings: Settings) -> list[dict]:
    """One entry per cache folder of host's ranks, with the models each holds (or the error that hid them)."""
    by_cache: dict[str, list[int]] = {}
    for rank in host.ranks:
        by_cache.setdefault(str(settings.hub_cache(rank)), []).append(rank)
    entries = [{"host": host.name, "ranks": ranks, "cache": cache, "models": [], "error": ""}
               for cache, ranks in by_cache.items()]
    if host.local:
        for e in entries:
            e["models"] = [dataclasses.asdict(m) for m in scan(Path(e["cache"]))]
        return entries
    args = ["--root", str(REPO_ROOT), "--model", settings.MODEL, "--list-models"]
    for cache in by_cache:
        args += ["--hub-cache", cache]
    facts, fault = run_probe(host, args)
    for e in entries:
        if facts is None or "caches" not in facts:
            e["error"] = fault or (facts or {}).get("problem", "the probe listed no cache")
        else:
            e["models"] = facts["caches"].get(e["cache"], [])
    return entries


def served(settings: Settings) -> dict:
    """What the running engine serves (its Info), or MODEL while no engine answers."""
    info = engine_info(settings.socket_path, INFO_TIMEOUT)
    if info is None:
        return {"served": settings.MODEL, "engine": "down", "configured": settings.MODEL, "served_path": ""}
    path = Path(info.model_path)
    repo = repo_of_folder(path.parent.parent) if path.parent.name == "snapshots" else None
    if repo is not None:
        # the engine runs a repo id: the configured spelling when it names that repo (it may carry @REVISION)
        name = settings.MODEL if (split_model(settings.MODEL) or ("",))[0] == repo else repo
    else:
        name = settings.MODEL if info.model == settings.model_name else info.model
    return {"served": name, "engine": "up", "configured": settings.MODEL, "served_path": info.model_path}


def generated(settings: Settings) -> list[dict]:
    """The demo and zoo models this host generated (in MODEL_CACHE_DIR); any host makes the same ones."""
    out = []
    try:
        folders = sorted(p for p in settings.model_cache_dir.iterdir() if p.is_dir())
    except OSError:
        return out
    for folder in folders:
        if m := _GENERATED.match(folder.name):
            size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
            out.append({"name": m.group(1), "version": int(m.group(2)), "folder": str(folder), "size": size})
    return out


def write(doc: dict, run_dir: Path) -> Path:
    """RUN_DIR/models.json, atomically (the dashboard may read it at any moment)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / MODELS_FILE
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=f".{MODELS_FILE}.")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def models(settings: Settings, as_json: bool) -> int:
    """Print the table (or the JSON), write RUN_DIR/models.json; 1 when a host could not be listed."""
    doc = gather(settings)
    try:
        write(doc, settings.run_dir)
    except OSError as exc:
        say(f"note: cannot write {settings.run_dir / MODELS_FILE} for the dashboard: {exc}")
    print(json.dumps(doc, indent=1) if as_json else render(doc))
    return 1 if any(e["error"] for e in doc["hosts"]) else 0


# -- the table ---------------------------------------------------------------------------------------------


def render(doc: dict) -> str:
    """One row per model (repo @ commit), the places holding it, and the served one marked."""
    places = doc["hosts"]
    several = {e["host"] for e in places if sum(1 for x in places if x["host"] == e["host"]) > 1}
    label = {id(e): e["host"] + (f" rank {','.join(map(str, e['ranks']))}" if e["host"] in several else "")
             for e in places}
    rows: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
    for e in places:
        for m in e["models"]:
            rows.setdefault((m["repo"], m["commit"]), []).append((e, m))
    head = ("model", "size", "complete", "on", "")
    table = []
    for (repo, commit), held in sorted(rows.items()):
        whole = [label[id(e)] for e, m in held if m["complete"]]
        revisions = sorted({r for _, m in held for r in m["revisions"]})
        name = f"{repo} @ {commit[:7]}" + (f" ({', '.join(revisions)})" if revisions else "")
        total = max(m["total"] for _, m in held)
        table.append((name, human(total), _completeness(held, places, label), ", ".join(whole) or "-",
                      _mark(doc, repo, commit, revisions)))
    for g in doc["generated"]:
        table.append((f"{g['name']} (generated, v{g['version']})", human(g["size"]), "yes", "generated on each host",
                      _mark(doc, g["name"], "", [])))
    widths = [max(len(r[i]) for r in [head, *table]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [head, *table]]
    if not table:
        lines.append("(no model in any cache)")
    state = ("the engine serves " + doc["served"]) if doc["engine"] == "up" else \
        f"the engine is not running; MODEL={doc['configured']}"
    lines += ["", state]
    if doc["engine"] == "up" and doc["served"] != doc["configured"]:
        lines.append(f"MODEL={doc['configured']} in the settings (the next start serves it)")
    lines += [f"FAULT {e['host']} ({e['cache']}): {e['error']}" for e in places if e["error"]]
    return "\n".join(lines)


def _completeness(held: list[tuple[dict, dict]], places: list[dict], label: dict) -> str:
    """yes, or what is missing where: files a place lacks, places that lack the model."""
    gaps = [f"{label[id(e)]} lacks {len(m['missing'])} file(s)" if m["missing"] else
            f"{label[id(e)]} is partial" if m["manifest"] else
            f"{label[id(e)]} is unchecked (./launch.sh download {m['repo']} checks it, moving only what differs)"
            for e, m in held if not m["complete"]]
    holders = {id(e) for e, _ in held}
    gaps += [f"not on {label[id(e)]}" for e in places if id(e) not in holders and not e["error"]]
    return "yes" if not gaps else "no: " + "; ".join(gaps)


def _mark(doc: dict, repo: str, commit: str, revisions: list[str]) -> str:
    """<- served (what the engine runs) and/or <- MODEL (what the settings name) for this row."""
    marks = []
    if doc["engine"] == "up" and _names(doc["served"], doc["served_path"], repo, commit, revisions):
        marks.append("served")
    if _names(doc["configured"], "", repo, commit, revisions) and not (marks and doc["configured"] == doc["served"]):
        marks.append("MODEL")
    return "<- " + ", ".join(marks) if marks else ""


def _names(model: str, path: str, repo: str, commit: str, revisions: list[str]) -> bool:
    """Whether MODEL (or the engine's folder, when given) is this row: a generated name, or a repo's commit."""
    if not commit:
        return model == repo
    if path:
        return Path(path).name == commit and Path(path).parent.parent.name == "models--" + repo.replace("/", "--")
    parsed = split_model(model)
    return parsed is not None and parsed[0] == repo and (parsed[1] in revisions or parsed[1] == commit)


def human(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return str(n)
