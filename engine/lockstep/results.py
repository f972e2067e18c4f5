"""What one batched step produced on a rank (no MLX needed to build or read one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class PromptRows:
    """Logprobs of consecutive prompt tokens, each given the tokens before it: of the token at start + 1 + j, its
    own (chosen[j]) and the most likely alternatives (top_ids[j], top_values[j]; empty lists when none asked)."""

    start: int
    chosen: list[float]
    top_ids: list[list[int]]
    top_values: list[list[float]]


@dataclass
class StepResults:
    """One step's outcome on this rank.

    tokens: (request id, sampled token, finish reason) per token a decoding request gained, in order: one per
    request in a plain step, up to 1 + its accepted draft tokens in a speculative one (the finish reason only on
    its last); logprob_rows maps the requests that asked for logprobs to their rows over the vocabulary (mx.arrays),
    one per token of theirs in `tokens`, in the same order; failed maps the requests this step ended because
    generating them raised, to the reason (identical on every rank). proposed and accepted count the draft tokens
    this step verified and kept (engine/speculative), drafted the requests that had drafts to verify in it.
    reused maps each sequence this step's plan inserted to the prompt tokens it really took from the prefix cache
    (0 where the ranks no longer held the entry rank 0 looked up: then it computed them all).
    """

    tokens: list[tuple[str, int, str | None]] = field(default_factory=list)
    logprob_rows: dict[str, list[Any]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    proposed: int = 0
    accepted: int = 0
    drafted: set[str] = field(default_factory=set)
    reused: dict[str, int] = field(default_factory=dict)
    positions: int = 0  # a speculative step's decoding positions (rows x widest draft); 0 for a plain step
    # requests that asked for their prompt's logprobs: the rows this step's prefill computed
    # (engine/lockstep/prompt_logprobs.py PromptRows), in prompt order
    prompt_rows: dict[str, list[PromptRows]] = field(default_factory=dict)
