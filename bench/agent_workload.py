"""The agent workload of bench/agent_replay.py: a coding agent's long system prompt, its tools, and its turns.

An agent sends the same instructions and tool definitions with every request and appends to one
conversation turn after turn, so each prompt extends the previous one. The system prompt is sized
in the served model's own tokens (`fit_system` asks the server's /tokenize).
"""

from __future__ import annotations

HEADER = (
    "You are Forge, a coding agent working inside the user's repository through the tools listed below. "
    "You read before you write, you change as little as the task needs, and you say what you did and why. "
    "The guidelines that follow are numbered; when two of them disagree, the one with the lower number wins."
)

# Each guideline is formatted with an area of the code base and a file of it, so the lines differ.
GUIDELINES = [
    "Before editing {path}, read the whole function you are about to change and the tests that cover {area}.",
    "Never invent an API of {area}: search the repository for its definition first and quote the line you rely on.",
    "Keep changes to {path} minimal: no reformatting, no renamed variables, no reordered imports unless asked.",
    "When a command fails, show the last twenty lines of its output and state the cause before trying again.",
    "Run only the tests of {area} after a change, then the whole suite once before you declare the task done.",
    "Prefer apply_patch with a unified diff over rewriting {path}; a patch that does not apply means re-read it.",
    "Do not touch files under vendor/ or generated/ even when a test of {area} points there; report it instead.",
    "If the user's request about {area} is ambiguous, ask one precise question rather than guessing twice.",
    "Secrets never leave the machine: do not print environment variables, tokens or the contents of .env files.",
    "A shell command that deletes, moves or overwrites more than one file needs the user's explicit consent.",
    "Explain a failing assertion in {path} by comparing the expected and actual values, not by paraphrasing.",
    "Keep answers short: the change, the reason, the command that proves it, in that order and nothing else.",
    "When you search for a symbol of {area}, search for its callers as well before changing its signature.",
    "Type hints in {path} follow the surrounding code; do not add annotations the module does not already use.",
    "Long outputs are summarised: the first error, the count of the others, and where the full log lies.",
    "After a patch to {path}, re-read the patched region once to check indentation and the closing brackets.",
]
AREAS = [
    ("the parser", "src/parser/lists.py"), ("the tokenizer", "src/parser/tokens.py"),
    ("the HTTP client", "src/net/client.py"), ("the cache layer", "src/store/cache.py"),
    ("the CLI", "src/cli/main.py"), ("the config loader", "src/config/load.py"),
    ("the scheduler", "src/jobs/scheduler.py"), ("the database models", "src/db/models.py"),
    ("the auth middleware", "src/web/auth.py"), ("the report renderer", "src/report/render.py"),
    ("the plugin loader", "src/plugins/loader.py"),
]

TOOLS = [
    {"type": "function", "function": {
        "name": "read_file",
        "description": "Read a text file of the repository, optionally a range of its lines.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": "Path relative to the repository root."},
            "start_line": {"type": "integer", "minimum": 1, "description": "First line to return (1-based)."},
            "end_line": {"type": "integer", "minimum": 1, "description": "Last line to return, inclusive."},
        }, "required": ["path"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "search_code",
        "description": "Search the repository for a literal string or a regular expression.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for."},
            "regex": {"type": "boolean", "default": False, "description": "Treat query as a regular expression."},
            "path_glob": {"type": "string", "description": "Only files matching this glob, e.g. src/**/*.py."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 200, "default": 50},
        }, "required": ["query"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "apply_patch",
        "description": "Apply a unified diff to one file; fails without changing anything if a hunk does not apply.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string"},
            "patch": {"type": "string", "description": "A unified diff with @@ hunks against the current file."},
            "create_if_missing": {"type": "boolean", "default": False},
        }, "required": ["path", "patch"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "run_command",
        "description": "Run a shell command in the repository and return its exit code, stdout and stderr.",
        "parameters": {"type": "object", "properties": {
            "command": {"type": "string", "description": "The command line, run by /bin/sh -c."},
            "cwd": {"type": "string", "description": "Working directory relative to the repository root."},
            "timeout_seconds": {"type": "number", "minimum": 1, "maximum": 600, "default": 120},
            "env": {"type": "object", "additionalProperties": {"type": "string"},
                    "description": "Extra environment variables."},
        }, "required": ["command"], "additionalProperties": False}}},
    {"type": "function", "function": {
        "name": "list_directory",
        "description": "List the entries of a directory, recursively up to a depth.",
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "default": "."},
            "depth": {"type": "integer", "minimum": 1, "maximum": 5, "default": 1},
            "include_hidden": {"type": "boolean", "default": False},
        }, "required": [], "additionalProperties": False}}},
]

FIRST_USER = ("I'm getting a failing test in tests/test_parser.py::{test}. Can you find out why? "
              "It started after yesterday's merge.")
FOLLOW_UPS = [
    "Here is the output:\n```\nFAILED tests/test_parser.py::test_nested_lists - AssertionError: "
    "assert [[1, 2], [3]] == [[1, 2, 3]]\n```\nWhat does parse_list do with a closing bracket?",
    "Open src/parser/lists.py and show me the function that handles ']'.",
    "OK, propose a minimal patch; keep the public API unchanged.",
    "Apply it and run only the parser tests.",
    "Two tests still fail: test_empty_list and test_trailing_comma. Look at the tokenizer too.",
    "Search the repo for other callers of split_items before we change its signature.",
    "Summarise the change in one paragraph for the commit message.",
]


def system_prompt(lines: int, tag: str = "") -> str:
    """HEADER and `lines` numbered guidelines; a tag at the very start makes a prompt no cache holds."""
    body = [f"{i + 1}. " + GUIDELINES[i % len(GUIDELINES)].format(area=AREAS[i % len(AREAS)][0],
                                                                  path=AREAS[i % len(AREAS)][1])
            for i in range(lines)]
    return (f"[{tag}] " if tag else "") + HEADER + "\n\n" + "\n".join(body)


def first_user(variant: str = "test_nested_lists") -> str:
    return FIRST_USER.format(test=variant)


def follow_up(turn: int) -> str:
    """The user's message of turn `turn` (2, 3, ...)."""
    text = FOLLOW_UPS[(turn - 2) % len(FOLLOW_UPS)]
    return text if turn - 2 < len(FOLLOW_UPS) else f"{text} (again, round {turn})"


def opening(system: str, user: str) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def extend(messages: list[dict], answer: dict, tool_calls: list[dict], next_user: str) -> list[dict]:
    """The conversation after an answer: the assistant's message, a result for each tool call it made,
    then the user's next message."""
    out = [*messages, answer]
    for call in tool_calls:
        out.append({"role": "tool", "tool_call_id": call.get("id", ""),
                    "content": '{"ok": true, "output": "(elided)"}'})
    out.append({"role": "user", "content": next_user})
    return out

