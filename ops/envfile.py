"""Change a few variables of .env in place: every other line, comment and blank line stays as the user wrote it.

`launch.sh switch` writes MODEL (and SERVED_MODEL_NAME) here, so the next start serves what the switch chose.
Values are written so python-dotenv (what config.load_settings reads .env with) reads them back unchanged.
"""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path

# KEY=..., optionally after `export`, as python-dotenv reads an assignment
_ASSIGN = re.compile(r"^(\s*(?:export\s+)?)([A-Za-z_][A-Za-z0-9_]*)(\s*=\s*)(.*)$")
_PLAIN = re.compile(r"^[A-Za-z0-9_./:@~+,-]*$")
# an unquoted value's trailing comment, which a rewrite keeps
_COMMENT = re.compile(r"\s+#.*$")


def quote(value: str) -> str:
    """value as a .env value: bare when it holds nothing dotenv reads specially, else quoted (single quotes
    where they can: dotenv expands ${VAR} inside double quotes)."""
    if _PLAIN.match(value):
        return value
    if "'" not in value and "\n" not in value:
        return f"'{value}'"
    if "${" in value:
        raise ValueError(f"{value!r} cannot be written to .env: dotenv would expand the ${{...}} in it")
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'


def rewrite(text: str, changes: dict[str, str | None]) -> str:
    """text with each key of changes set to its value (None: its lines removed); a key not yet there is appended.
    Raises ValueError for a value .env cannot hold."""
    out: list[str] = []
    done: set[str] = set()
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _ASSIGN.match(line)
        end = i + 1 if m is None else _value_end(lines, i, m.group(4))
        if m is None or m.group(2) not in changes:
            out.extend(lines[i:end])
        else:
            key, value = m.group(2), changes[m.group(2)]
            # python-dotenv lets the last assignment win: keep one line, where the first stood
            if value is not None and key not in done:
                comment = _COMMENT.search(m.group(4)) if end == i + 1 and not m.group(4).startswith(("'", '"')) else None
                out.append(f"{m.group(1)}{key}={quote(value)}" + (comment.group(0) if comment else ""))
            done.add(key)
        i = end
    out += [f"{key}={quote(value)}" for key, value in changes.items() if key not in done and value is not None]
    return "\n".join(out) + "\n" if out else ""


def _value_end(lines: list[str], i: int, value: str) -> int:
    """The line after an assignment's value: a quoted value may run over several lines."""
    if not value or value[0] not in "'\"" or _closed(value[1:], value[0]):
        return i + 1
    for j in range(i + 1, len(lines)):
        if _closed(lines[j], value[0]):
            return j + 1
    return len(lines)


def _closed(rest: str, q: str) -> bool:
    escaped = False
    for ch in rest:
        if escaped:
            escaped = False
        elif ch == "\\" and q == '"':
            escaped = True
        elif ch == q:
            return True
    return False


def update(path: Path, changes: dict[str, str | None]) -> None:
    """Rewrite path (created when absent) atomically, keeping its permissions (.env may hold API_KEY)."""
    path = path.resolve()
    try:
        text, mode = path.read_text(), path.stat().st_mode & 0o777
    except FileNotFoundError:
        text, mode = "", 0o600
    _replace(path, rewrite(text, changes).encode(), mode)


@dataclass(frozen=True)
class Saved:
    """A .env as it was: its bytes (None: there was none) and permissions."""

    path: Path
    data: bytes | None
    mode: int = 0o600


def save(path: Path) -> Saved:
    """path's bytes and permissions, so that restore() can put them back exactly (a switch that rolls back)."""
    path = path.resolve()
    try:
        return Saved(path, path.read_bytes(), path.stat().st_mode & 0o777)
    except FileNotFoundError:
        return Saved(path, None)


def restore(saved: Saved) -> None:
    """The file as save() found it, byte for byte (removed if there was none), atomically."""
    if saved.data is None:
        saved.path.unlink(missing_ok=True)
    else:
        _replace(saved.path, saved.data, saved.mode)


def _replace(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".env.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
