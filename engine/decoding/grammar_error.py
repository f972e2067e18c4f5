"""The error a schema or tool definition that cannot become a grammar raises: in a module of its own, without MLX,
so that rank 0's tool-call formats (engine/toolformats) raise it without importing MLX."""

from __future__ import annotations


class GrammarError(ValueError):
    """A schema or tool definition that cannot become a grammar; the message says why.

    param, when set, names the request field at fault and the message is a whole sentence.
    """

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param
