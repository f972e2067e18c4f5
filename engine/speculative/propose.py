"""What a proposer is: rank 0 asks it for draft tokens for the decoding sequences before each plan."""

from __future__ import annotations

from typing import Protocol


class Proposer(Protocol):
    """Rank 0 only; never talks to another rank. Deterministic for a given history (the plan carries the result,
    so the other ranks need not repeat it, but a test may)."""

    def propose(self, histories: dict[str, list[int]], k: int) -> dict[str, list[int]]:
        """Up to k draft tokens per sequence, to follow its history: every token the sequence holds (prompt,
        output) and last its next input, which the step will feed. A sequence left out (or given []) decodes one
        token plainly."""
        ...

    def forget(self, rid: str) -> None:
        """The sequence left the batch: drop what is kept for it."""
        ...
