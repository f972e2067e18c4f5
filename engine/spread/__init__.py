"""Spreading a model from rank 0's cache to every rank's, over the cluster's own transport (`python -m engine.spread`,
started by ops/spread.py through mlx.launch)."""
