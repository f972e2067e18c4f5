"""The import boundaries, enforced: api/, ipc/, config/ and ops/ never pull in MLX or the engine, and engine/lockstep/
never imports rank 0."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

# Imports the package and every submodule but `__main__` (an entry point that would start serving),
# then prints the names of all loaded modules.
PROBE = """
import importlib, json, pkgutil, sys
pkg = importlib.import_module(sys.argv[1])
for mod in pkgutil.walk_packages(getattr(pkg, "__path__", []), pkg.__name__ + "."):
    if not mod.name.endswith(".__main__"):
        importlib.import_module(mod.name)
print(json.dumps(sorted(sys.modules)))
"""

HEAVY = ["mlx", "mlx_lm", "transformers"]

FORBIDDEN = {
    "ipc": [*HEAVY, "engine", "api", "starlette", "uvicorn", "config"],
    "config": [*HEAVY, "engine", "api", "starlette", "uvicorn", "ops"],
    # The process lifecycle: it starts the engine and the API, and imports neither.
    "ops": [*HEAVY, "engine", "api", "starlette", "uvicorn", "tokenizers"],
    # The API must restart in well under a second: no MLX, no tokenizer.
    "api": [*HEAVY, "engine", "tokenizers"],
}


def _matches(module: str, prefix: str) -> bool:
    # "mlx" stands for every mlx* distribution (mlx, mlx.core, mlx_lm, mlx_metal, ...).
    if prefix == "mlx":
        return module.startswith("mlx")
    return module == prefix or module.startswith(prefix + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_nothing_forbidden(package: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE, package],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"importing {package} failed:\n{proc.stderr}"
    loaded = json.loads(proc.stdout.strip().splitlines()[-1])
    assert package in loaded
    bad = sorted(m for m in loaded for p in FORBIDDEN[package] if _matches(m, p))
    assert not bad, f"importing {package} loaded modules it must never import: {bad}"


# The engine's logic that unit tests drive without MLX: the plan and its chunking, scheduling, admission, link pairs.
MLX_FREE_ENGINE = ["engine.lockstep.link_pairs", "engine.lockstep.plan", "engine.lockstep.results", "engine.rank0.errors",
                   "engine.rank0.lanes", "engine.rank0.links", "engine.rank0.piece", "engine.rank0.scheduler",
                   "engine.rank0.validate", "engine.parallel", "engine.speculative.ngram",
                   "engine.speculative.schedule", "engine.diskcache.identity"]

IMPORT_ONE = """
import importlib, json, sys
importlib.import_module(sys.argv[1])
print(json.dumps(sorted(sys.modules)))
"""

# Imports every test module of tests/unit (with its conftest) as pytest would, then lists what got loaded.
IMPORT_UNIT_TESTS = """
import importlib.util, json, pathlib, sys
for path in sorted(pathlib.Path("tests/unit").glob("*.py")):
    spec = importlib.util.spec_from_file_location("unit_" + path.stem, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(json.dumps(sorted(sys.modules)))
"""


def _loaded(code: str, *args: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("module", MLX_FREE_ENGINE)
def test_engine_logic_imports_no_mlx(module: str) -> None:
    loaded = _loaded(IMPORT_ONE, module)
    assert module in loaded
    bad = sorted(m for m in loaded for p in HEAVY if _matches(m, p))
    assert not bad, f"importing {module} loaded {bad}"


def test_the_unit_tests_import_no_mlx() -> None:
    bad = sorted(m for m in _loaded(IMPORT_UNIT_TESTS) for p in HEAVY if _matches(m, p))
    assert not bad, f"tests/unit loaded {bad}: unit tests run without MLX"


# The API's dialects: each stands on the floor under api/ (request_fields, request_checks), never on another.
DIALECTS = ["anthropic", "ollama", "openai", "responses"]
FLOOR = ["api/request_fields.py", "api/request_checks.py"]


def _imported(path: Path) -> set[str]:
    """Every module a source file imports, at its top or inside a function, relative imports resolved
    (`from api import openai` counts as api.openai)."""
    package = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts[:-1])
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)  # `from engine import rank0`
    return names


@pytest.mark.parametrize("dialect", DIALECTS)
def test_a_dialect_imports_no_other_dialect(dialect: str) -> None:
    others = [f"api.{d}" for d in DIALECTS if d != dialect]
    files = sorted((REPO_ROOT / "api" / dialect).glob("*.py"))
    assert files
    bad = sorted(f"{path.relative_to(REPO_ROOT)}: {name}" for path in files for name in _imported(path)
                 for other in others if _matches(name, other))
    assert not bad, f"api/{dialect}/ imports another dialect (move what they share to the floor, {FLOOR}): {bad}"


def test_the_floor_imports_no_dialect() -> None:
    bad = sorted(f"{path}: {name}" for path in FLOOR for name in _imported(REPO_ROOT / path)
                 for d in DIALECTS if _matches(name, f"api.{d}"))
    assert not bad, f"the dialects' floor imports a dialect: {bad}"


def test_lockstep_never_imports_rank0() -> None:
    # lockstep/ is what every rank runs; rank 0's loop around it (engine/leader.py) is one floor up.
    files = sorted((REPO_ROOT / "engine" / "lockstep").rglob("*.py"))
    assert files
    bad = sorted(f"{path.relative_to(REPO_ROOT)}: {name}" for path in files for name in _imported(path)
                 if _matches(name, "engine.rank0"))
    assert not bad, f"engine/lockstep imports rank 0's modules: {bad}"


def test_the_disk_tier_imports_no_rank0_lockstep_or_api() -> None:
    # engine/diskcache/ is a floor under both rank 0's index and every rank's lockstep: it decides nothing itself.
    files = sorted((REPO_ROOT / "engine" / "diskcache").rglob("*.py"))
    assert files
    bad = sorted(f"{path.relative_to(REPO_ROOT)}: {name}" for path in files for name in _imported(path)
                 for floor in ("engine.rank0", "engine.lockstep", "engine.leader", "api") if _matches(name, floor))
    assert not bad, f"engine/diskcache imports what stands on it: {bad}"


def test_no_two_modules_import_each_other() -> None:
    # A circle (even through an import inside a function) makes the pair one module in two files: which half
    # loads first decides what works. A package and its own submodules are exempt (an __init__ re-exports).
    modules = {}
    for path in sorted(p for package in ("api", "config", "engine", "ipc", "ops") for p in
                       (REPO_ROOT / package).rglob("*.py")):
        name = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    imports = {name: _imported(path) & modules.keys() for name, path in modules.items()}
    circles = sorted(f"{a} <-> {b}" for a in imports for b in imports[a]
                     if a < b and a in imports[b] and not _matches(a, b) and not _matches(b, a))
    assert not circles, f"modules that import each other (move what both need into a third): {circles}"
