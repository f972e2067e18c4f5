"""Rank 0: a chat's image parts into prompt tokens and plan rows.

The chat template writes the family's marker where each image part is; the marker becomes the processor's
expansion (so many image tokens per image) before tokenizing; each image's run of image tokens then takes that
image's own ids (engine/vision/ids.py), and its features wait here for the request's Insert.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from typing import Any

from engine.lockstep.plan import ImageRows
from engine.rank0.errors import Refused
from engine.vision.ids import FIRST, ImageIds


def image_parts(messages: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(field path, part) of every image part, in the order the template meets them."""
    found = []
    for i, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):
            for j, part in enumerate(content):
                if isinstance(part, dict) and part.get("type") == "image":
                    found.append((f"messages[{i}].content[{j}]", part))
    return found


class VisionPrompts:
    """The tower's side of rank 0's prompts; features are computed once per image content while remembered."""

    def __init__(self, tower: Any, remembered: int = 64):
        self.tower = tower
        self.ids = ImageIds()
        self.rows: OrderedDict[int, ImageRows] = OrderedDict()  # by first id
        self.remembered = remembered
        self._lock = threading.Lock()  # tokenizer lanes run in parallel; the tower runs one image at a time

    def expand(self, text: str) -> str:
        return text.replace(self.tower.marker, self.tower.expansion)

    def place(self, tokens: list[int], parts: list[tuple[str, dict[str, Any]]]) -> list[int]:
        """tokens with each image's run of image tokens replaced by its ids; raises Refused."""
        runs = _runs(tokens, self.tower.image_token_id, self.tower.tokens_per_image)
        if len(runs) != len(parts):
            raise Refused(f"the chat template placed {len(runs)} image(s) but the messages hold {len(parts)}; "
                          "put images in user messages only", parts[0][0] if parts else "messages")
        out = list(tokens)
        for start, (field, part) in zip(runs, parts):
            ids = self._ids(field, part)
            out[start:start + len(ids)] = ids
        return out

    def image_rows(self, tokens: list[int]) -> list[ImageRows]:
        """The features of every image whose ids are in tokens (placed by place())."""
        with self._lock:
            return [self.rows[t] for t in dict.fromkeys(t for t in tokens if t >= FIRST) if t in self.rows]

    def _ids(self, field: str, part: dict[str, Any]) -> list[int]:
        from engine.vision.table import encode

        sha = part.get("sha256")
        if not isinstance(sha, str) or not isinstance(part.get("data"), bytes):
            raise Refused("an image part needs its sha256 and data bytes", field)
        with self._lock:
            ids = self.ids.ids(sha, self.tower.tokens_per_image)
            if ids[0] in self.rows:
                self.rows.move_to_end(ids[0])
                return ids
            image = _decode(part["data"], field)
            self.rows[ids[0]] = encode(self.tower.features(image), ids[0])
            while len(self.rows) > self.remembered:
                self.rows.popitem(last=False)
        return ids


def _decode(data: bytes, field: str):
    """The image as mlx-vlm opens it (EXIF orientation applied, RGB)."""
    from mlx_vlm.utils import load_image

    try:
        return load_image(io.BytesIO(data))
    except Exception as exc:  # PIL raises several kinds for a file it cannot read
        raise Refused(f"the image cannot be decoded ({exc}); send a PNG, JPEG, WebP or GIF file", field) from None


def _runs(tokens: list[int], image_id: int, length: int) -> list[int]:
    """Start of every run of `length` image tokens."""
    starts, i = [], 0
    while i < len(tokens):
        if tokens[i] == image_id:
            starts.append(i)
            i += length
        else:
            i += 1
    return starts
