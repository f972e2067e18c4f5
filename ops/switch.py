"""`./launch.sh switch MODEL [--served-name NAME]`: serve another model while the API keeps running.

Checked first (every rank's cache holds a repo id whole; a folder, demo or zoo name is valid; with an engine
running, rank 0's host builds the model lazily and its tokenizer, as the load would), then written into .env,
then the engine alone restarts with it. Meanwhile the API answers 503 engine_unavailable, and afterwards names
the new model: it takes the served name from the engine's Info. If the new model does not come up, the switch
rolls back by itself: .env as it was, byte for byte, and the previous model started again.
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
from ops.verdict import child_refusal

LOAD_CHECK_TIMEOUT = 120  # seconds: importing mlx-lm, building the model without weights and its tokenizer


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
        if services.engine.pids.running() is not None:
            # what only building it tells (a tokenizer that does not build, weights that do not fit the config),
            # while the running engine still serves
            if (why := child_refusal(["-m", "engine.loadcheck"], LOAD_CHECK_TIMEOUT, {**os.environ, **forwarded})):
                raise Die(1, f"cannot switch to {model}: {why}; {settings.model_name} keeps serving, .env unchanged")
        env_file = Path(os.environ.get("ENV_FILE") or REPO_ROOT / ".env")
        saved = envfile.save(env_file)
        environ = {key: os.environ.get(key) for key in forwarded}
        _write_env(env_file, settings, model, served_name, changes, forwarded, new)
        os.environ.update(forwarded)  # engine_ctl forwards the variables set here to every rank (--env)
        try:
            return restart_with(new, services)
        except Failed as failed:
            # the new model did not come up: everything as it was, the previous model started again
            envfile.restore(saved)
            _put_back(environ)  # the previous engine's ranks get the environment it had (--env)
            raise Die(1, roll_back(settings, Services(Layout(settings)), model, failed)) from None


def _put_back(environ: dict[str, str | None]) -> None:
    for key, value in environ.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


class Failed(Exception):
    """The engine did not come up on the new model; the message says what failed. interrupted: by a signal."""

    def __init__(self, why: str, interrupted: bool = False):
        super().__init__(why)
        self.interrupted = interrupted


def roll_back(old: Settings, services: Services, model: str, failed: Failed) -> str:
    """The previous model started again (the engine was stopped for the new one); the sentence to exit with: what
    became of the service, then what failed (the engine's own words, which end with the fix)."""
    what = f"the switch to {model} failed"
    if services.engine.pids.running() is not None and services.engine.info() is not None:
        return f"{what} ({old.model_name} kept serving, .env is as it was): {failed}"  # refused before the stop
    if failed.interrupted:
        return (f"{what}: interrupted, so nothing was started again (.env is as it was: ./launch.sh restart-engine "
                f"serves {old.MODEL})")
    say(f"the engine did not start with MODEL={model}: starting {old.MODEL} again")
    api_pid = services.api.pids.running()
    if services.restart_engine(locked=True) != 0:
        return (f"{what}, and {old.MODEL} did not start again either ({services.engine.failed or 'see above'}; "
                f".env is as it was: fix that and run ./launch.sh restart-engine): {failed}")
    if api_pid is not None:
        services.api.wait_ready(api_pid, "200")  # its next answers name the previous model again
    return f"{what} and was rolled back ({old.model_name} serves again, .env is as it was): {failed}"


def _write_env(env_file: Path, settings: Settings, model: str, served_name: str, changes: dict[str, str | None],
               forwarded: dict[str, str], new: Settings) -> None:
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
    untouched, learns the new name. Raises Failed when the engine does not come up."""
    api_pid = services.api.pids.running()
    if services.engine.pids.running() is None and api_pid is None:
        say(f"nothing runs: ./launch.sh start serves {new.MODEL}")
        return 0
    new.run_dir.mkdir(parents=True, exist_ok=True)
    new.switch_file.write_text(json.dumps({"model": new.model_name}))
    try:
        code = services.restart_engine(locked=True)
    except Die as exc:  # refused after the stop (a ring port taken meanwhile, the ranks cannot split the model)
        raise Failed(str(exc)) from None
    finally:
        new.switch_file.unlink(missing_ok=True)
    if code != 0:
        raise Failed(services.engine.failed or "see above", interrupted=code == 130)
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
