"""`python -m bench.tool_grammars`: how long the agents' own tools take to become a forced-call grammar, per format.

bench/data/agent_tools.json holds the tools Claude Code and Codex CLI send. For every tool-call format (its zoo
model's tokenizer, engine/zoo/tool_models.py) and both agents, this builds and checks the grammar a forced call
compiles to, as rank 0's admission does (`Grammars.tool_grammar`): `tool_choice` "required" with parallel calls,
and the agent's largest tool by name. "first" is a fresh Grammars (llguidance's view of the tokenizer built
beforehand, untimed, as the engine warms it at start), "repeat" the same request again (the compiled grammar
is cached by its text; the text is still written and checked). A format that cannot take one of the tools
shows the refusal a client would get (400). The zoo tokenizers have 1,024 tokens: a real model's 150k-token
vocabulary makes a compile slower, so quote the machine and the vocabulary with the numbers.

    .venv/bin/python -m bench.tool_grammars [--reps 3] [--agents claude_code codex] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `python bench/tool_grammars.py`
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import table  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
AGENT_TOOLS = REPO / "bench" / "data" / "agent_tools.json"


def agent_tools(path: Path = AGENT_TOOLS) -> dict[str, list[dict[str, Any]]]:
    """{agent: its chat-completions function tools} from the captured definitions."""
    return {k: v for k, v in json.loads(path.read_text()).items() if not k.startswith("_")}


def largest(tools: list[dict[str, Any]]) -> str:
    """The name of the tool with the largest parameters schema: the hardest one to force by name."""
    return max(tools, key=lambda t: len(json.dumps(t["function"].get("parameters") or {})))["function"]["name"]


def choices(tools: list[dict[str, Any]]) -> list[tuple[str, str | dict[str, Any], bool]]:
    """(label, tool_choice, parallel) of the forced calls measured."""
    named = largest(tools)
    return [("required", "required", True), (named, {"type": "function", "function": {"name": named}}, False)]


def compile_once(grammars: Any, fmt: Any, tools: list[dict[str, Any]], choice: str | dict[str, Any],
                 parallel: bool) -> tuple[float, str]:
    """(seconds, grammar text) of one forced-call grammar built and checked; raises GrammarError."""
    t0 = time.perf_counter()
    grammar = grammars.tool_grammar(fmt, tools, choice, parallel)
    return time.perf_counter() - t0, grammar


def measure(tokenizer: Any, ll: Any, fmt: Any, tools: list[dict[str, Any]], choice: str | dict[str, Any],
            parallel: bool, reps: int) -> tuple[str, str, str]:
    """(first ms, repeat ms, grammar size) as table cells, the first median of `reps` fresh Grammars; or the
    refusal in the first cell. ll: llguidance's view of the tokenizer, built once (the engine builds it at
    start, in the background: not a compile's cost)."""
    from engine.decoding.constrained import GrammarError, Grammars

    firsts, repeats, size = [], [], 0
    for _ in range(reps):
        grammars = Grammars(tokenizer)
        grammars._ll = ll  # the view built once, shared: a fresh Grammars would build it again
        try:
            took, grammar = compile_once(grammars, fmt, tools, choice, parallel)
        except GrammarError as exc:
            return f"refused (400): {exc}", "", ""
        firsts.append(took)
        repeats.append(compile_once(grammars, fmt, tools, choice, parallel)[0])
        size = len(grammar)
    return (f"{statistics.median(firsts) * 1e3:.1f}", f"{statistics.median(repeats) * 1e3:.1f}",
            f"{size / 1024:.0f} KiB")


def pad_vocabulary(tokenizer: Any, n: int) -> None:
    """Add n distinct filler tokens (ordinary, not special) to the tokenizer, as a stand-in for the vocabulary
    of a real model: llguidance's token trie, and with it each mask, grows with it."""
    import random
    import string

    from engine import mlx_compat

    rng, words, alphabet = random.Random(0), set(), string.ascii_letters + string.digits + "_{}<>\" "
    while len(words) < n:
        words.add("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 10))))
    mlx_compat.hf_tokenizer(tokenizer).add_tokens(sorted(words))


def main(argv: list[str] | None = None) -> int:
    from engine import mlx_compat
    from engine.decoding.constrained import Grammars
    from engine.rank0.output import OutputRules
    from engine.zoo.tool_models import TOOL_CALLING_MODELS, load_tool_model_tokenizer

    parser = argparse.ArgumentParser(prog="python -m bench.tool_grammars", description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(TOOL_CALLING_MODELS),
                        help="zoo models, one per format (default: every format's)")
    parser.add_argument("--agents", nargs="*", default=None, help="agents of agent_tools.json (default: all)")
    parser.add_argument("--reps", type=int, default=3, help="fresh compiles per cell (the median is shown)")
    parser.add_argument("--pad-vocab", type=int, default=0, metavar="N",
                        help="add N filler tokens first, for a real model's vocabulary size (150000: llguidance "
                             "then takes about 2 minutes per format to read the tokenizer here)")
    parser.add_argument("--cache-dir", type=Path, default=REPO / ".cache" / "models")
    args = parser.parse_args(argv)
    agents = agent_tools()
    rows, slowest = [], 0.0
    for model in args.models:
        name, tokenizer = load_tool_model_tokenizer(model, args.cache_dir)
        fmt = OutputRules(tokenizer).format
        if args.pad_vocab:
            pad_vocabulary(tokenizer, args.pad_vocab)
        ll = Grammars(tokenizer).ll_tokenizer()
        for agent in args.agents or list(agents):
            tools = agents[agent]
            for label, choice, parallel in choices(tools):
                first, repeat, size = measure(tokenizer, ll, fmt, tools, choice, parallel, args.reps)
                rows.append([name, f"{agent} ({len(tools)})", label, first, repeat, size])
                slowest = max(slowest, float(first) if size else 0.0)
                print("  " + " | ".join(rows[-1])[:160], file=sys.stderr, flush=True)
    vocab = len(mlx_compat.hf_tokenizer(tokenizer))
    print(f"## Forced-call grammars of the agents' own tools, per tool-call format ({vocab:,}-token vocabulary; "
          f"ms: median of {args.reps} fresh compiles)\n")
    print(table(["format", "agent (tools)", "tool_choice", "ms first", "ms repeat", "grammar"], rows))
    print(f"\nslowest first compile: {slowest:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
