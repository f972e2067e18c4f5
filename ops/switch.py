"""`./launch.sh switch MODEL [--served-name NAME]`: serve another model while the API keeps running.

Checked first (every rank's cache holds a repo id whole; a folder, demo or zoo name is valid), then written
into .env, then the engine alone restarts with it. Meanwhile the API answers 503 engine_unavailable, and
afterwards names the new model: it takes the served name from the engine's Info.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from config import REPO_ROOT, ConfigError, Settings, load_settings
from config.hub_cache import split_model
from config.model_folder import folder_problem
from ops import envfile
from ops.cluster import cluster_hosts
from ops.commands import Services
from ops.hostprobe import GENERATED, generated_models
from ops.layout import Die, Layout, say
from ops.models import host_places


def switch(settings: Settings, model: str, served_name: str) -> int:
    refuse_unusable(settings, model)
    changes: dict[str, str | None] = {"MODEL": model, "SERVED_MODEL_NAME": served_name or None}
    if settings.PIPELINE_LAYERS:
        # layer counts per rank fit one model's depth: the new one would be refused at load, or split badly
        changes["PIPELINE_LAYERS"] = None
        say(f"PIPELINE_LAYERS={settings.PIPELINE_LAYERS} counted the layers of {settings.MODEL}: cleared, so the "
            f"ranks split {model} by their memory (set it again for {model} if you want another split)")
    # what every rank must see, .env or not: the environment wins over .env, and remote hosts' .env may be old
    forwarded = {key: value or "" for key, value in changes.items()}
    try:
        new = load_settings({**os.environ, **forwarded})
    except ConfigError as exc:
        raise Die(2, f"configuration error with MODEL={model}: {exc}") from None
    services = Services(Layout(new))
    # no start, stop or restart may run meanwhile: .env and the engine change together, or neither does
    with services.locked():
        # what a start would refuse (a folder or cached repo that cannot load here) before .env names it
        services.engine.refuse_broken_model()
        _write_env(settings, model, served_name, changes, forwarded, new)
        os.environ.update(forwarded)  # engine_ctl forwards the variables set here to every rank (--env)
        return restart_with(new, services)


def _write_env(settings: Settings, model: str, served_name: str, changes: dict[str, str | None],
               forwarded: dict[str, str], new: Settings) -> None:
    env_file = Path(os.environ.get("ENV_FILE") or REPO_ROOT / ".env")
    try:
        envfile.update(env_file, changes)
    except (OSError, ValueError) as exc:
        raise Die(1, f"cannot write {env_file}: {exc}") from None
    dropped = f" (SERVED_MODEL_NAME={settings.SERVED_MODEL_NAME} removed)" if settings.SERVED_MODEL_NAME else ""
    say(f"{env_file}: MODEL={model}" + (f", SERVED_MODEL_NAME={served_name}" if served_name else dropped)
        + f"; clients name it {new.model_name}")
    for key in changes:
        if key in os.environ and os.environ[key] != forwarded[key]:
            say(f"note: {key}={os.environ[key]} is set in the environment, which wins over .env: unset it, or the "
                "next ./launch.sh start serves that again")


def restart_with(new: Settings, services: Services) -> int:
    """The engine restarted on the new settings (as restart-engine, under the caller's launch lock); the API,
    untouched, learns the new name."""
    api_pid = services.api.pids.running()
    if services.engine.pids.running() is None and api_pid is None:
        say(f"nothing runs: ./launch.sh start serves {new.MODEL}")
        return 0
    new.run_dir.mkdir(parents=True, exist_ok=True)
    new.switch_file.write_text(json.dumps({"model": new.model_name}))
    try:
        code = services.restart_engine(locked=True)
    finally:
        new.switch_file.unlink(missing_ok=True)
    if code != 0:
        say(f"the engine did not start with MODEL={new.MODEL} (see above); .env names it now: fix the cause and run "
            "./launch.sh restart-engine, or ./launch.sh switch back to the previous model")
        return code
    # /health makes the API ask the engine again, so its next answers name the new model at once
    if api_pid is not None and services.api.wait_ready(api_pid, "200"):
        say(f"switched: the API (pid {api_pid}, not restarted) serves {new.model_name}")
    return 0


def refuse_unusable(settings: Settings, model: str) -> None:
    """Die with what to run when the ranks could not load model; a repo id is looked up in every rank's cache."""
    for prefix, kind, names_file, listed in GENERATED:
        if model.startswith(prefix):
            names = generated_models(REPO_ROOT, names_file, listed)
            if model[len(prefix):] not in names:
                raise Die(1, f"{model} is not a {kind} model: use one of {', '.join(prefix + n for n in names)}")
            return
    if model.startswith(("/", ".", "~")):
        path = Path(model).expanduser()
        path = path if path.is_absolute() else REPO_ROOT / path
        if (problem := folder_problem(path) if path.is_dir() else f"{path} is not a folder") is not None:
            raise Die(1, f"cannot switch to {model}: {problem}")
        return
    if split_model(model) is None:
        raise Die(1, f"cannot switch to {model!r}: give a Hugging Face repo id (ORG/NAME or ORG/NAME@REVISION), a "
                     "local model folder (starting with /, . or ~), or a demo or zoo name")
    if gaps := cache_gaps(settings, model):
        raise Die(1, "\n".join([f"cannot switch to {model}: not every rank has it whole", *gaps]))


def cache_gaps(settings: Settings, model: str) -> list[str]:
    """One sentence per place (a host's cache folder) that lacks model or holds it incomplete, saying what to run."""
    repo, revision = split_model(model) or ("", "")
    hosts, faults = cluster_hosts(settings)
    gaps = [f"  {fault}" for fault in faults]
    fix = f"./launch.sh download {model}"
    for host in hosts:
        for place in host_places(host, settings):
            where = f"  {place['host']} (rank {','.join(map(str, place['ranks']))}, cache {place['cache']})"
            if place["error"]:
                gaps.append(f"{where} could not be asked: {place['error']}")
                continue
            held = [m for m in place["models"] if m["repo"] == repo
                    and (revision in m["revisions"] or m["commit"] == revision)]
            if not held:
                gaps.append(f"{where} lacks it: run {fix}")
            elif not held[0]["complete"]:
                missing = held[0]["missing"]
                what = f"{len(missing)} file(s) missing ({', '.join(missing[:3])})" if missing else "partial"
                gaps.append(f"{where} holds it incomplete, {what}: run {fix} to finish it")
    return gaps
