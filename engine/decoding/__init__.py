"""Decoding on every rank: per-request samplers, and grammars that mask what a request may sample."""
