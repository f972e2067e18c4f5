"""A rule over the source: no `mx.distributed` collective anywhere in the repository is handed a stream other
than the CPU. MLX runs a collective on the stream it is given, and a Mac's default streams (mlx-lm's generation
stream among them) are the GPU's, where Metal has no collectives: the start of every multi-rank engine would die
there, while Linux, where the default device is the CPU, could never tell."""

from __future__ import annotations

import ast
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP = {".venv", ".git", "node_modules", "run", "logs", ".cache"}
# each collective's positional parameters before `stream` (mlx.core.distributed's signatures)
BEFORE_STREAM = {"all_sum": 2, "all_max": 2, "all_min": 2, "all_gather": 2, "sum_scatter": 2, "send": 3,
                 "recv": 4, "recv_like": 3}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return node.id if isinstance(node, ast.Name) else "?"


def _on_the_cpu(node: ast.AST) -> bool:
    """`mx.cpu` (or mlx.core.cpu), or None: MLX then picks the CPU's stream itself."""
    return (isinstance(node, ast.Constant) and node.value is None) or _dotted(node).endswith(("mx.cpu", "core.cpu"))


def offenders(source: str, name: str) -> tuple[int, list[str]]:
    """(collective calls seen, those handed a stream that is not the CPU's) in one file's source."""
    seen, bad = 0, []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr not in BEFORE_STREAM or not _dotted(node.func.value).endswith("distributed"):
            continue
        seen += 1
        where = f"{name}:{node.lineno} {_dotted(node.func)}"
        if len(node.args) > BEFORE_STREAM[node.func.attr]:
            bad.append(f"{where} passes a stream by position")
        bad += [f"{where} passes stream={ast.unparse(k.value)}" for k in node.keywords
                if k.arg == "stream" and not _on_the_cpu(k.value)]
        bad += [f"{where} passes **{ast.unparse(k.value)}" for k in node.keywords if k.arg is None]
    return seen, bad


def test_no_collective_in_the_repository_is_handed_a_stream_other_than_the_cpus() -> None:
    seen, bad = 0, []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP]  # never walk .venv
        for name in files:
            path = Path(folder) / name
            text = path.read_text() if name.endswith(".py") else ""
            if "distributed" in text:
                n, found = offenders(text, str(path.relative_to(ROOT)))
                seen, bad = seen + n, bad + found
    assert seen >= 20, f"only {seen} collective calls found: the rule no longer sees the code"
    assert not bad, ("build a collective with no stream (or mx.cpu), inside `with mx.stream(model_stream)` where "
                     "it must keep its order with the model's work (engine/lockstep/beside.py):\n" + "\n".join(bad))


def test_the_rule_catches_each_way_of_handing_a_collective_the_models_stream() -> None:
    source = """
mx.distributed.all_sum(x, group=g, stream=self.stream)
mx.distributed.send(x, 1, g, gen.stream)
mlx.core.distributed.recv_like(x, 0, group=g, stream=mx.gpu)
distributed.all_gather(x, **kw)
mx.distributed.all_sum(x, group=g, stream=mx.cpu)
mx.distributed.recv((4,), mx.uint8, 0, group=g)
with mx.stream(gen.stream):
    mx.distributed.all_sum(x, group=g)
"""
    seen, bad = offenders(source, "f.py")
    assert seen == 7
    assert [b.split()[0] for b in bad] == ["f.py:2", "f.py:3", "f.py:4", "f.py:5"]
