"""DeepSeek-V3 and R1's variant of DeepSeek's call markup: the name and fenced JSON (engine/toolformats/deepseek.py)."""

from engine.toolformats.deepseek import FENCED as FORMAT

__all__ = ["FORMAT"]
