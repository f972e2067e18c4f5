"""What one batched step produced on a rank (no MLX needed to build or read one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepResults:
    """One step's outcome on this rank.

    tokens: (request id, sampled token, finish reason) per decoding request; logprob_rows maps the
    requests that asked for logprobs to their row over the vocabulary (an mx.array); failed maps the
    requests this step ended because generating them raised, to the reason (identical on every rank).
    """

    tokens: list[tuple[str, int, str | None]] = field(default_factory=list)
    logprob_rows: dict[str, Any] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
