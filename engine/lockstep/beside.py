"""Where a collective of ours runs: built with no stream, under the model's stream, as mlx-lm's own are.

MLX evaluates an `mx.distributed` call on the stream it is given, and Metal has no GPU collectives, so a
collective handed mlx-lm's generation stream (the GPU on a Mac) dies there. Given no stream, the ring and
JACCL groups pick the CPU's default stream, and that is where the model's tensor-parallel all_sums land: mlx-lm
builds them with no stream under `with mx.stream(generation_stream)`, which changes the CPU's default only when
the generation stream is itself a CPU stream (Linux). Built the same way, ours land on that very stream.

One stream is what keeps the ranks in step: a stream runs its work in the order it was queued, and every rank
queues its collectives in the same program order, so the n-th collective meets the n-th on every rank. A plan
queued after a forward pass's all_sums (`PlanChannel.post`) therefore runs after them without waiting for the
GPU: it depends on no data of the pass, and waiting (an mx.eval of the pass) would only delay reading the
plan ahead. On two CPU streams (a collective's and the model's) their order would be a race, different per rank.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import mlx.core as mx


def beside(model_stream) -> AbstractContextManager:
    """The context to build a collective in (with no stream of its own) so it queues behind the model's."""
    return mx.stream(model_stream) if model_stream is not None else nullcontext()
