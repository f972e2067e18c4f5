"""What every rank runs in step: the plan each step broadcasts, the batch it applies to, the loop.

Importing this package loads no MLX: the plan schema and its chunking are plain Python; the
MLX-backed pieces live in their own modules (channel, batch, loop).
"""
