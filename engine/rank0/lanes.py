"""Where rank 0 runs its tokenizer jobs (a Generate's prompt, a Tokenize, a Detokenize): in worker threads, off
the event loop, a big one in the one big-job slot and every other beside it.

A tokenizer holds ~200 bytes per byte of text at its peak, so 8 MB prompts arriving together queue rather than
take gigabytes each at once. Smaller jobs (a 64k-token conversation is ~250 KB; a count_tokens call) never wait
for them: a small call queued behind 3-4 MB bodies would wait seconds for nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import anyio

BIG_PROMPT_BYTES = 256 * 1024  # a job whose frame is larger is big
BIG_TOKENIZER_WORKERS = 1

A = TypeVar("A")
R = TypeVar("R")


class TokenizerLanes:
    """The big-job slot and the lane beside it; made on the event loop that uses it."""

    def __init__(self) -> None:
        self.big = anyio.CapacityLimiter(BIG_TOKENIZER_WORKERS)

    async def run(self, work: Callable[[A], R], arg: A, frame_bytes: int) -> R:
        """work(arg) in a worker thread, in the lane the size of the frame that asked for it picks."""
        limiter = self.big if frame_bytes > BIG_PROMPT_BYTES else None  # None: anyio's default thread limiter
        return await anyio.to_thread.run_sync(work, arg, limiter=limiter)
