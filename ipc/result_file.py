"""The result file of a job every rank runs through mlx.launch (ops/rank_job.py): rank 0 writes it, ops reads it
once mlx.launch has exited (mlx.launch exits 0 whatever its ranks did, so its exit code says nothing)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Generic, TypeVar

import msgspec

T = TypeVar("T")


class ResultFile(Generic[T]):
    """One result type as JSON, typed both ways."""

    def __init__(self, kind: type[T]):
        self._encoder = msgspec.json.Encoder()
        self._decoder = msgspec.json.Decoder(kind)

    def encode(self, result: T) -> bytes:
        """The result as JSON."""
        return self._encoder.encode(result)

    def decode(self, data: bytes) -> T:
        """Raises msgspec.ValidationError / DecodeError when data is not a result."""
        return self._decoder.decode(data)

    def write(self, path: Path, result: T) -> None:
        """Whole or not at all: ops never reads half a file."""
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(self.encode(result))
        os.replace(tmp, path)
