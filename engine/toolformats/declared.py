"""The tools a forced call may use, each with the JSON schema its arguments are held to (for any format's grammar)."""

from __future__ import annotations

from typing import Any

# A function declared without parameters takes none, as OpenAI reads it: its arguments are {}.
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def allowed_tools(tools: list[dict[str, Any]], named: str | None) -> list[tuple[str, dict[str, Any]]]:
    """(name, arguments schema) of every declared tool, or of `named` alone; raises GrammarError when a tool's
    parameters are not a schema or `named` is not declared."""
    allowed = []
    for i, tool in enumerate(tools):
        fn = tool.get("function", {})
        name = fn.get("name")
        if named is not None and name != named:
            continue
        params = fn.get("parameters")
        if params is None:
            params = NO_ARGUMENTS
        elif not isinstance(params, dict):
            param = f"tools[{i}].function.parameters"
            _refuse(f"{param} (function {name!r}) must be a JSON schema object", param)
        elif not params:
            params = {"type": "object"}
        allowed.append((str(name), params))
    if not allowed:
        _refuse(f"tool_choice names a function that is not in tools: {named!r}")
    return allowed


def _refuse(message: str, param: str | None = None) -> None:
    from engine.decoding.constrained import GrammarError  # it imports MLX: only when refusing

    raise GrammarError(message, param)
