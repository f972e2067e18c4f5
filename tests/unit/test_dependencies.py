"""Every third-party module the project's packages import is a dependency pyproject.toml declares: one that
arrives only through another package's requirements can go away with that package's next release."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys

import pytest

from tests.harness import REPO

PACKAGES = ("api", "config", "engine", "ipc", "ops")


def imported_modules() -> dict[str, str]:
    """Top-level name of each absolute import in PACKAGES -> the first file that imports it."""
    found: dict[str, str] = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.partition(".")[0]
                    if (path.parent / f"{top}.py").exists():  # a script's sibling (ops/hostprobe.py's macfacts)
                        continue
                    found.setdefault(top, str(path.relative_to(REPO)))
    return found


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return {normalize(re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req).group(0)) for req in project["dependencies"]}


def test_every_third_party_import_of_the_project_is_declared_in_pyproject():
    distributions = importlib.metadata.packages_distributions()
    ours, deps = set(PACKAGES), declared()
    missing = []
    for module, where in sorted(imported_modules().items()):
        if module in ours or module in sys.stdlib_module_names or module == "__future__":
            continue
        providers = {normalize(d) for d in distributions.get(module, [])}
        assert providers, f"{module} (imported by {where}) is not installed: no distribution provides it"
        if not providers & deps:
            missing.append(f"{module} (imported by {where}; from {', '.join(sorted(providers))})")
    assert not missing, "imported but not declared in pyproject.toml's dependencies: " + "; ".join(missing)
