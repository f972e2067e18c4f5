"""What one host of the cluster has, as JSON on stdout: Python, mlx, mlx-lm, the project, the model, and on a
Mac what macOS says (ops/macfacts.py).

Standard library only and self-contained with ops/macfacts.py: `./launch.sh check` pipes the two into
`ssh HOST python - ARGS`, so it runs even where the project is missing or broken.
It reports facts; ops.cluster compares them across hosts and decides what is a fault.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import platform
import runpy
import socket
import subprocess
import sys
from pathlib import Path

try:
    import macfacts  # run as a script: beside this file, or registered first by the shipped bundle
except ImportError:
    from ops import macfacts

# The files that must be identical on every host (the ranks run in lockstep).
CODE_DIRS = ("api", "engine", "ipc", "config", "ops")
CODE_FILES = ("pyproject.toml", "launch.sh")
DEMO_PREFIX = "demo-"
# Models each host generates itself, deterministically: (prefix, generator package under engine/,
# the plain-data module naming its models, the tuple there). The same generator makes the same model.
GENERATED = (
    (DEMO_PREFIX, "demo", "engine/demo/specs.py", "DEMO_MODELS"),
    ("zoo-", "zoo", "engine/zoo/names.py", "SERVED_MODELS"),
    # converted from a wheel each host's setup fetched and verified (engine/gguf): the same converter, the same model
    ("smollm2-", "gguf", "engine/gguf/packaged.py", "SMOLLM2"),
)
# The project's check of a model folder's files (standard library only, so it runs here as a file).
FOLDER_CHECK = "config/model_folder.py"
# The cache layout and the lookup every rank makes of a repo id (standard library only, run as a file too).
HUB_CACHE = "config/hub_cache.py"


def file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def code_hash(root: Path) -> str:
    h = hashlib.sha256()
    files = [root / f for f in CODE_FILES if (root / f).is_file()]
    for d in CODE_DIRS:
        files += sorted(p for p in (root / d).rglob("*") if p.is_file() and p.suffix in (".py", ".html", ".js", ".css"))
    for f in files:
        h.update(str(f.relative_to(root)).encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or "~/.cache/huggingface"
    return Path(home).expanduser() / "hub"


def model_facts(model: str, root: Path, caches: list[Path] | None = None) -> dict:
    """{"ok": bool, "identity": what must match across hosts, "problem": why not ok}."""
    for prefix, kind, names_file, listed in GENERATED:
        if model.startswith(prefix):
            return _generated_facts(model, root, prefix, kind, names_file, listed)
    if model.startswith(("/", ".", "~")):
        path = Path(model).expanduser()
        path = path if path.is_absolute() else root / path
        if not path.exists():
            return {"ok": False, "problem": f"MODEL path {path} does not exist"}
        if not (path / "config.json").is_file():
            return {"ok": False, "problem": f"MODEL path {path} has no config.json"}
        return _folder_facts(root, path)
    return _cached_facts(model, root, caches or [hf_cache()])


def _cached_facts(model: str, root: Path, caches: list[Path]) -> dict:
    """A repo id in each of this host's rank caches, through the project's own lookup (config/hub_cache.py)."""
    try:
        hub = runpy.run_path(str(root / HUB_CACHE))
    except (OSError, SyntaxError) as exc:
        return {"ok": False, "problem": f"cannot look up MODEL {model}: {root / HUB_CACHE} does not run ({exc})"}
    parsed = hub["split_model"](model)
    if parsed is None:
        return {"ok": False, "problem": f"MODEL={model!r} is neither a local folder, a demo or zoo name, nor a "
                                        "Hugging Face repo id (ORG/NAME or ORG/NAME@REVISION)"}
    snapshots = []
    for cache in caches:  # first what a cache lacks (download fixes it), then what is wrong with the files
        snapshot, why = hub["locate"](cache, *parsed)
        if snapshot is None:
            return {"ok": False, "problem": f"{why}: run ./launch.sh download {model}"}
        snapshots.append(snapshot)
    for snapshot in snapshots:
        if not (facts := _folder_facts(root, snapshot))["ok"]:
            return facts
    return _folder_facts(root, snapshots[0])


def _folder_facts(root: Path, path: Path) -> dict:
    if problem := folder_problem(root, path):
        return {"ok": False, "problem": problem}
    weights = sum(f.stat().st_size for f in path.glob("*.safetensors"))
    return {"ok": True, "identity": f"config.json {file_hash(path / 'config.json')}", "path": str(path),
            "bytes": weights}


def folder_problem(root: Path, path: Path) -> str | None:
    """What the project's own check finds wrong with a model folder; None also where that check is missing."""
    try:
        check = runpy.run_path(str(root / FOLDER_CHECK))["folder_problem"]
    except (OSError, KeyError, SyntaxError):
        return None
    return check(path)


def _generated_facts(model: str, root: Path, prefix: str, kind: str, names_file: str,
                     listed: str) -> dict:
    gen = root / Path(names_file).parent
    if not gen.is_dir():
        return {"ok": False, "problem": f"the {kind} model generator {gen} is missing"}
    names = generated_models(root, names_file, listed)
    if model[len(prefix):] not in names:
        return {"ok": False, "problem": f"MODEL={model!r} is not a {kind} model: use one of "
                                        f"{', '.join(prefix + n for n in names)}"}
    # the generator and the floor it builds on (engine/modelgen: the tokenizer, the draws)
    files = sorted(f for d in (gen, root / "engine" / "modelgen") for f in d.rglob("*")
                   if f.is_file() and "__pycache__" not in f.parts)
    digest = hashlib.sha256("".join(file_hash(f) for f in files).encode()).hexdigest()
    return {"ok": True, "identity": f"{model} generator v{generator_version(root, kind)} {digest[:8]}"}


def generated_models(root: Path, names_file: str, listed: str) -> tuple[str, ...]:
    """The model names (without their prefix) the host's generator makes; that module is plain data."""
    try:
        return tuple(runpy.run_path(str(root / names_file))[listed])
    except (OSError, KeyError, SyntaxError):
        return ()


def generator_version(root: Path, kind: str) -> str:
    """A model generator's VERSION (engine.demo or engine.zoo), as it states it (in this host's project)."""
    python = root / ".venv" / "bin" / "python"
    cmd = [str(python) if python.exists() else sys.executable, "-c",
           f"from engine.{kind} import VERSION; print(VERSION)"]
    try:
        r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return r.stdout.strip() if r.returncode == 0 and r.stdout.strip().isdigit() else "?"


def probe(root: Path, model: str, caches: list[Path] | None = None, reach: tuple[str, ...] = (), python: str = "",
          run: macfacts.Runner = macfacts.run_command, system: str = platform.system()) -> dict:
    venv_python = root / ".venv" / "bin" / "python"
    facts = {
        "hostname": socket.gethostname(),
        "python": platform.python_version(),
        "executable": sys.executable,
        "venv": venv_python.exists(),
        "mlx": version("mlx"),
        "mlx_lm": version("mlx-lm"),
        "project": (root / "launch.sh").is_file(),
        **system_facts(root, reach, python, run, system),
    }
    if facts["project"]:
        facts["code"] = code_hash(root)
        env = root / ".env"
        facts["env"] = file_hash(env) if env.is_file() else None
        facts["model"] = model_facts(model, root, caches)
    return facts


def system_facts(root: Path, reach: tuple[str, ...], python: str, run: macfacts.Runner, system: str,
                 home: Path | None = None) -> dict:
    """What the operating system says: RDMA devices, setup's Python, rank 0's ports dialled, and on a Mac the rest."""
    home = Path.home() if home is None else home
    darwin = system == "Darwin"
    return {
        "ibv": macfacts.ibv_ports(run),
        "system": system,
        "hidden": macfacts.hidden_folder(root, home) if darwin else None,
        "setup_python": macfacts.setup_python(run, python),
        "reach": {address: macfacts.reach(address) for address in reach},
        "mac": macfacts.mac_facts(run, root / ".venv" / "bin" / "python") if darwin else None,
    }


def cached_models(root: Path, caches: list[Path]) -> dict:
    """{"hostname", "caches": {folder: [each model as config/hub_cache.py's scan() lists it]}} for `launch.sh models`."""
    out: dict = {"hostname": socket.gethostname(), "caches": {}}
    try:
        hub = runpy.run_path(str(root / HUB_CACHE))
    except (OSError, SyntaxError) as exc:
        out["problem"] = f"cannot list the models: {root / HUB_CACHE} does not run ({exc})"
        return out
    for cache in caches or [hf_cache()]:
        out["caches"][str(cache)] = [dataclasses.asdict(m) for m in hub["scan"](cache)]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", required=True, help="the project folder (the same path on every host)")
    parser.add_argument("--model", required=True, help="MODEL as configured")
    parser.add_argument("--hub-cache", action="append", default=[],
                        help="the Hugging Face cache folder of one of this host's ranks (repeated; default: HF_HUB_CACHE)")
    parser.add_argument("--list-models", action="store_true", help="only list the models in those caches")
    parser.add_argument("--env", action="append", default=[], help="NAME=VALUE set first, as mlx.launch sets it for a rank")
    parser.add_argument("--reach", action="append", default=[], help="HOST:PORT to open a TCP connection to (repeated)")
    parser.add_argument("--python", default="", help="PYTHON as sync forwards it to setup (default: setup's own search)")
    args = parser.parse_args()
    macfacts.apply_env(args.env)
    root = Path(args.root)
    # as a rank resolves its cache: ~ is this host's home, a relative folder is inside the project
    caches = [root / Path(c).expanduser() for c in args.hub_cache]
    facts = (cached_models(root, caches) if args.list_models
             else probe(root, args.model, caches, tuple(args.reach), args.python))
    print(json.dumps(facts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
