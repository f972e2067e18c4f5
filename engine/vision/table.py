"""Every rank: the image features of the running requests, read by the model's own embedding layer.

The embedding module's class is swapped for a subclass whose call puts an image's feature rows where the tokens are
image ids (engine/vision/ids.py) and embeds every other token as before; its parameters, sharding and the tied
output (as_linear) are untouched, so the language model stays mlx-lm's.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from engine.lockstep.plan import ImageRows
from engine.vision.ids import FIRST


class FeatureTable:
    """Image features by first id, each held while a request that carries it runs."""

    def __init__(self):
        self.rows: dict[int, mx.array] = {}
        self.owners: dict[int, set[str]] = {}
        self.grids: dict[int, tuple[int, int]] = {}  # first id -> (rows, columns) of its image tokens
        self.positions = None  # engine/vision/mrope.py Positions, for a family whose images change positions
        # a family whose features go into its first layers too (engine/vision/deepstack.py): where the forward pass
        # running now holds image tokens (flat indices) and their rows for those layers [tokens, layers, hidden]
        self.deep: tuple[mx.array, mx.array] | None = None
        self._stacked: tuple[np.ndarray, np.ndarray, mx.array] | None = None  # firsts, starts, every row

    def add(self, rid: str, images: list[ImageRows]) -> None:
        for image in images:
            if image.grid:
                self.grids[image.first] = (image.grid[0], image.grid[1])
            if image.data and image.first not in self.rows:  # without data: its grid alone (engine/vision/ids.py)
                self.rows[image.first] = decode(image)
                self._stacked = None
            self.owners.setdefault(image.first, set()).add(rid)

    def keep_only(self, rids: set[str]) -> None:
        """Let go of the features no running request carries."""
        for first in [f for f, owners in self.owners.items() if not owners & rids]:
            del self.owners[first]
            self.rows.pop(first, None)
            self.grids.pop(first, None)
            self._stacked = None
        for owners in self.owners.values():
            owners &= rids

    def lookup(self, ids: np.ndarray) -> mx.array:
        """The feature rows of image ids (a flat array); raises KeyError for an image no request carries."""
        if self._stacked is None:
            firsts = sorted(self.rows)
            sizes = [self.rows[f].shape[0] for f in firsts]
            self._stacked = (np.array(firsts, np.int64), np.cumsum([0] + sizes[:-1]).astype(np.int64),
                             mx.concatenate([self.rows[f] for f in firsts]))
        firsts, starts, rows = self._stacked
        at = np.searchsorted(firsts, ids, side="right") - 1
        offset = ids - firsts[np.maximum(at, 0)]
        sizes = np.diff(np.append(starts, rows.shape[0]))
        bad = (at < 0) | (offset >= sizes[np.maximum(at, 0)])
        if bad.any():
            raise KeyError(f"image token {int(ids[bad][0])} has no features on this rank")
        return rows[mx.array((starts[at] + offset).astype(np.uint32))]


def encode(features: mx.array, first: int, grid: tuple[int, int] | None = None) -> ImageRows:
    """One image's features [rows, hidden] for the plan (grid: its tokens' rows and columns, where they matter)."""
    if features.dtype == mx.bfloat16:
        data, dtype = np.array(features.view(mx.uint16)).tobytes(), "bfloat16"
    else:
        data = np.array(features).tobytes()
        dtype = str(np.array(features[:0]).dtype)
    return ImageRows(first=first, rows=features.shape[0], dtype=dtype, data=data, grid=list(grid or ()))


def decode(image: ImageRows) -> mx.array:
    if image.dtype == "bfloat16":
        return mx.array(np.frombuffer(image.data, np.uint16).reshape(image.rows, -1)).view(mx.bfloat16)
    return mx.array(np.frombuffer(image.data, np.dtype(image.dtype)).reshape(image.rows, -1))


_subclasses: dict[type, type] = {}


def install(model, table: FeatureTable) -> bool:
    """Make the model's token embedding read image features from `table`; False where it has none to hook."""
    embed = find_embedding(model)
    if embed is None:
        return False
    base = type(embed)
    if base not in _subclasses:
        _subclasses[base] = type(f"Image{base.__name__}", (base,), {"__call__": _embed_with_images})
    embed.__class__ = _subclasses[base]
    object.__setattr__(embed, "_image_table", table)
    return True


def find_embedding(model):
    """The token embedding of an mlx-lm model (embed_tokens under language_model.model or model)."""
    for path in (("language_model", "model", "embed_tokens"), ("model", "embed_tokens"), ("embed_tokens",)):
        node = model
        for name in path:
            node = node.get(name) if isinstance(node, dict) else None
            if node is None:
                break
        if node is not None:
            return node
    return None


def _embed_with_images(self, x: mx.array) -> mx.array:
    table: FeatureTable = object.__getattribute__(self, "_image_table")
    base_call = type(self).__mro__[1].__call__
    table.deep = None
    if not table.rows:
        return base_call(self, x)
    mask = x >= FIRST
    ids = np.array(x)
    if not (ids >= FIRST).any():
        return base_call(self, x)
    h = base_call(self, mx.where(mask, 0, x))
    rows = table.lookup(ids[ids >= FIRST]).astype(h.dtype)
    # the image rows in order of their positions, scattered back into the token grid
    flat = h.reshape(-1, h.shape[-1])
    where = mx.array(np.flatnonzero(ids.reshape(-1) >= FIRST).astype(np.uint32))
    if rows.shape[-1] > h.shape[-1]:  # the input rows, then one row per DeepStack layer
        table.deep = (where, rows[:, h.shape[-1]:].reshape(rows.shape[0], -1, h.shape[-1]))
        rows = rows[:, :h.shape[-1]]
    flat[where] = rows
    return flat.reshape(h.shape)
