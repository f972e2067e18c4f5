"""Every rank: M-RoPE (Qwen-VL) on mlx-lm's text model, for the sequences that hold images.

An image's tokens take 3-D positions (t, row, column) from the position where the image starts, and the text after
it continues from their largest + 1, so every later token sits `delta` = max(rows, columns) - rows * columns before
its index (get_rope_index of mlx-vlm). With equal t, row and column a position is a plain RoPE position, so mlx-lm's
rope runs as before for every forward pass without images; one that feeds or follows an image rotates by the
positions computed here, with mlx-vlm's own rotary embedding.

The positions follow from the tokens alone: each image's ids are its own (engine/vision/ids.py) and its grid travels
with its features (ImageRows.grid), so a sequence's delta is the sum over the images its tokens hold, whether they
came from the prefix cache or were computed, whichever batch it runs in. Its uid keeps the sum up to where it was
last read, so a decode step scans only the tokens since.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from engine.vision.ids import FIRST


class Positions:
    """The positions [3, batch, tokens] of the forward pass running now, None when mlx-lm's own rope serves."""

    def __init__(self):
        self.current: mx.array | None = None
        self.layer = 1 << 30  # the first attention layer: its cache's offset is where a pass starts


class MRope(nn.Module):
    """In place of an attention layer's rope: mlx-lm's, or mlx-vlm's rotary embedding at `positions.current`."""

    def __init__(self, base: nn.Module, rotary: nn.Module, positions: Positions):
        super().__init__()
        self._base, self._rotary, self._positions = base, rotary, positions

    def __call__(self, x: mx.array, offset=0) -> mx.array:
        at = self._positions.current
        if at is None:
            return self._base(x, offset=offset)
        return self._rotary.apply_rotary(x, x, at)[0]


def install(model: Any, make_rotary, table) -> None:
    """Give every attention layer of the text model an MRope reading one Positions, kept on the table."""
    positions = Positions()
    layers = model.layers if hasattr(model, "layers") else model.language_model.model.layers
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)  # linear attention layers (Qwen3.5) take no positions
        if attn is not None:
            attn.rope = MRope(attn.rope, make_rotary(attn), positions)
            positions.layer = min(positions.layer, i)
    table.positions = positions


class _Deltas:
    """Per sequence (uid): how far its scan of its tokens got and the delta there."""

    def __init__(self, table):
        self.table = table
        self.seen: dict[int, tuple[int, int, bool]] = {}  # uid -> (tokens scanned, delta after them, any image)

    def image(self, token: int) -> tuple[int, int, int]:
        """(index of the token in its image, the image's rows, columns) of an image token."""
        firsts = sorted(self.table.grids)
        at = int(np.searchsorted(firsts, token, side="right")) - 1
        rows, columns = self.table.grids[firsts[at]] if at >= 0 else (0, 0)
        if at < 0 or token - firsts[at] >= rows * columns:
            raise KeyError(f"image token {token} has no grid on this rank")
        return token - firsts[at], rows, columns

    def after(self, token: int) -> int:
        """What the image ending at this token (else 0) adds to the delta."""
        k, rows, columns = self.image(token)
        return max(rows, columns) - rows * columns if k == rows * columns - 1 else 0

    def row(self, uid: int, history: list[int], start: int, chunk: np.ndarray) -> np.ndarray | None:
        """The positions [3, len(chunk)] of a sequence's tokens start.. (None: plain positions serve)."""
        n, delta, any_image = self.seen.get(uid, (0, 0, False))
        if n > start:  # rolled back (rejected drafts): the delta holds unless an image was dropped, then scan again
            if any(t >= FIRST for t in history[start:n]):
                delta, any_image = 0, False
                n = 0
            else:
                n = start
        for token in history[n:start]:
            if token >= FIRST:
                any_image = True
                delta += self.after(token)
        self.seen[uid] = (start, delta, any_image)
        if not any_image and not (chunk >= FIRST).any():
            return None
        out = np.empty((3, len(chunk)), np.int64)
        for col, token in enumerate(chunk.tolist()):
            j = start + col
            if token >= FIRST:
                k, rows, columns = self.image(token)
                first = j - k + delta  # where this image's positions start
                out[:, col] = (first, first + k // columns, first + k % columns)
                if k == rows * columns - 1:
                    delta += max(rows, columns) - rows * columns
            else:
                out[:, col] = j + delta
        return out

    def forget(self, uids: set[int]) -> None:
        for uid in [u for u in self.seen if u not in uids]:
            del self.seen[uid]


def attach(gen: Any, table) -> None:
    """Have a BatchGenerator's forward passes set their positions (no-op for a model without M-RoPE)."""
    positions = table.positions
    if positions is None:
        return
    _track_new_batches()
    deltas = _Deltas(table)
    model = gen._prompt_batch.model

    def forward(inputs, cache=None):
        batch = _batch_of(gen, cache)
        positions.current = _positions(deltas, batch, inputs, cache) if batch is not None else None
        try:
            return model(inputs, cache=cache)
        finally:
            positions.current = None
            live = set(gen._prompt_batch.uids) | set(gen._generation_batch.uids)
            if len(deltas.seen) > 4 * len(live) + 64:
                deltas.forget(live)

    # a split of the prompt batch and the decoding batch it becomes take their model from these two
    gen._prompt_batch.model = gen._generation_batch.model = forward


_stepping: list = []  # the GenerationBatch whose step runs now: one mlx-lm makes steps once inside its __init__


def _track_new_batches() -> None:
    from mlx_lm.generate import GenerationBatch

    step = GenerationBatch._step
    if getattr(step, "_tracked", False):
        return

    def tracked(self, *args, **kwargs):
        _stepping.append(self)
        try:
            return step(self, *args, **kwargs)
        finally:
            _stepping.pop()

    tracked._tracked = True
    GenerationBatch._step = tracked


def _batch_of(gen: Any, cache) -> Any:
    """The batch (uids, tokens) whose cache a forward pass runs on."""
    for batch in (*_stepping[-1:], gen._prompt_batch, gen._generation_batch):
        if batch.prompt_cache is cache:
            return batch
    return None


def _positions(deltas: _Deltas, batch, inputs: mx.array, cache) -> mx.array | None:
    if not deltas.table.grids:
        return None
    ids = np.array(inputs)
    offset = cache[deltas.table.positions.layer].offset if cache else 0
    starts = np.broadcast_to(np.array(offset), (ids.shape[0],)).tolist()
    rows = [deltas.row(uid, history, start, chunk)
            for uid, history, start, chunk in zip(batch.uids, batch.tokens, starts, ids)]
    if all(r is None for r in rows):
        return None
    plain = [np.broadcast_to(np.arange(s, s + ids.shape[1]), (3, ids.shape[1])) for s in starts]
    return mx.array(np.stack([p if r is None else r for r, p in zip(rows, plain)], axis=1))
