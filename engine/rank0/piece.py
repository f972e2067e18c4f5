"""What one step adds to a choice's output, already routed (no MLX: the scheduler's unit tests build these)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ipc.messages import ToolCall


@dataclass
class Piece:
    """What one step adds to a choice."""

    content: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.reasoning or self.tool_calls)

    def add(self, other: Piece) -> None:
        self.content += other.content
        self.reasoning += other.reasoning
        self.tool_calls.extend(other.tool_calls)
