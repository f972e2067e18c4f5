"""DeepSeek-V4's DSML: V3.2's invokes in a `tool_calls` block (engine/toolformats/dsml.py)."""

from engine.toolformats.dsml import V4 as FORMAT

__all__ = ["FORMAT"]
