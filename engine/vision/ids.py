"""Image placeholder ids: an image's tokens take ids of their own, past any vocabulary, stable per image content.

The prefix cache compares prompts by token ids, so the same image (same sha256) gets the same ids in every turn and
reuses the turn before's KV, while another image of the same size gets other ids and does not. No MLX here.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import OrderedDict

import msgspec

# Above every vocabulary (the largest are about 262,000 ids) and below 2**31 (token arrays are int32).
FIRST = 1 << 24
LIMIT = 1 << 31


def is_image(token: int) -> bool:
    return token >= FIRST


def has_images(tokens: list[int]) -> bool:
    return any(t >= FIRST for t in tokens)


def needed(images: list, tokens: list[int], start: int) -> list:
    """The images (each with .first and .rows, as the plan carries them) that a token of tokens[start:] belongs
    to: those wholly before `start` are in a prefix cache entry's KV already, so no rank embeds them again. One of
    those with a grid still goes, without its features: the positions after it follow from its grid
    (engine/vision/mrope.py)."""
    later = sorted({t for t in tokens[start:] if t >= FIRST})
    out = []
    for image in images:
        if _any_in(later, image.first, image.first + image.rows):
            out.append(image)
        elif getattr(image, "grid", None):
            out.append(msgspec.structs.replace(image, data=b""))
    return out


def carried(images: list, tokens: list[int]) -> bool:
    """Whether every image id among tokens has its features among images."""
    spans = sorted((image.first, image.first + image.rows) for image in images if image.data)
    starts = [low for low, _ in spans]
    for t in {t for t in tokens if t >= FIRST}:
        at = bisect_right(starts, t) - 1
        if at < 0 or t >= spans[at][1]:
            return False
    return True


def _any_in(ordered: list[int], low: int, high: int) -> bool:
    at = bisect_left(ordered, low)
    return at < len(ordered) and ordered[at] < high


class ImageIds:
    """Rank 0's ids per image content: base .. base + count - 1 for an image of `count` tokens."""

    def __init__(self, remembered: int = 4096):
        self.bases: OrderedDict[str, tuple[int, int]] = OrderedDict()
        self.remembered = remembered
        self.next = FIRST

    def ids(self, sha256: str, count: int) -> list[int]:
        if sha256 in self.bases and self.bases[sha256][1] == count:
            self.bases.move_to_end(sha256)
            base = self.bases[sha256][0]
        else:
            if self.next + count >= LIMIT:  # after about 8 million images: ids start over (old entries miss)
                self.next = FIRST
                self.bases.clear()
            base, self.next = self.next, self.next + count
            self.bases[sha256] = (base, count)
            while len(self.bases) > self.remembered:  # forgotten: that image's next turn computes again
                self.bases.popitem(last=False)
        return list(range(base, base + count))
