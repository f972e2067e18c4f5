"""The headless engine: every rank loads a shard and decodes in lockstep; rank 0 serves the socket."""
