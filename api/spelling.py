"""Engine refusals in each dialect's own words: the engine names OpenAI chat's parameters (stop, max_tokens,
tools[0].function.parameters); a dialect's client should read the names it sent (options.stop, max_output_tokens,
tools[0].input_schema), in the error's param and in its message."""

from __future__ import annotations

import re
from collections.abc import Sequence

from api.errors import APIError

# (the engine's name as a regex, the dialect's, \1 standing for an index): longer names first
Names = Sequence[tuple[str, str]]

# a name is whole: not part of a longer name or a dotted path ("options.stop" is not "stop" again)
_BEFORE, _AFTER = r"(?<![\w.\[])", r"(?![\w\[])"


def respell(err: APIError, names: Names) -> APIError:
    """err with the dialect's names, if the engine refused the request; the dialect's own errors say them already."""
    if not err.from_engine or not names:
        return err
    for engine, dialect in names:
        pattern = re.compile(_BEFORE + engine + _AFTER)
        err.message = pattern.sub(dialect, err.message)
        if err.param is not None:
            err.param = pattern.sub(dialect, err.param)
    err.from_engine = False  # respelled once
    return err
