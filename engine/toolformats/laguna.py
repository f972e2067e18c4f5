"""Poolside Laguna writes GLM-4.7's format; its converted checkpoints name the parser "laguna"."""

from engine.toolformats.glm47 import ArgKeyValue

FORMAT = ArgKeyValue("laguna")
