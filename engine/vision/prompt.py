"""Rank 0: a chat's image parts into prompt tokens and plan rows.

The chat template writes the family's marker where each image part is; the marker becomes the processor's
expansion (so many image tokens per image) before tokenizing; each image's run of image tokens then takes that
image's own ids (engine/vision/ids.py), and its features wait here for the request's Insert.
"""

from __future__ import annotations

import io
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from engine.lockstep.plan import ImageRows
from engine.rank0.errors import Refused
from engine.vision.ids import FIRST, ImageIds


class _Image:
    """One picture as rank 0 remembers it: its text in the prompt, its image token count, its features."""

    __slots__ = ("image", "expansion", "count", "rows")

    def __init__(self, image: Any, expansion: str, count: int):
        self.image, self.expansion, self.count = image, expansion, count
        self.rows: ImageRows | None = None


class VisionPrompts:
    """The tower's side of rank 0's prompts; features are computed once per image content while remembered."""

    def __init__(self, make_tower, remembered: int = 64):
        self.ids = ImageIds()
        self.images: OrderedDict[str, _Image] = OrderedDict()  # by sha256
        self.rows: OrderedDict[int, ImageRows] = OrderedDict()  # by first id: what an Insert carries
        self.remembered = remembered
        self._lock = threading.Lock()  # tokenizer lanes run in parallel
        # MLX keeps streams per thread, and a module may hold arrays its first call builds: the tower always runs
        # in this one thread, one image at a time
        self._tower_thread = ThreadPoolExecutor(1, thread_name_prefix="vision-tower")
        self.tower = self.run(make_tower)  # built there too: its arrays belong to that thread's streams

    def expand(self, text: str, parts: list[tuple[str, dict[str, Any]]]) -> str:
        """The rendered chat with each image's marker replaced as the family's processor replaces it; raises Refused."""
        pieces = text.split(self.tower.marker)
        if len(pieces) - 1 != len(parts):
            raise Refused(f"the chat template placed {len(pieces) - 1} image(s) but the messages hold {len(parts)}; "
                          "put images in user messages only", parts[0][0] if parts else "messages")
        out = [pieces[0]]
        for piece, (field, part) in zip(pieces[1:], parts):
            out += [self._image(field, part).expansion, piece]
        return "".join(out)

    def place(self, tokens: list[int], parts: list[tuple[str, dict[str, Any]]]) -> list[int]:
        """tokens with each image's image tokens (in order) replaced by its own ids; raises Refused."""
        from engine.vision.table import encode

        at = [i for i, t in enumerate(tokens) if t == self.tower.image_token_id]
        out, cursor = list(tokens), 0
        for field, part in parts:
            image = self._image(field, part)
            with self._lock:
                ids = self.ids.ids(part["sha256"], image.count)
                if image.rows is None or image.rows.first != ids[0]:
                    grid = getattr(self.tower, "grid", None)  # a family whose image tokens take 2-D positions
                    image.rows = self.run(lambda: encode(self.tower.features(image.image), ids[0],
                                                         grid(image.image) if grid else None))
                self.rows[ids[0]] = image.rows
                self.rows.move_to_end(ids[0])
                while len(self.rows) > self.remembered:
                    self.rows.popitem(last=False)
            if image.rows.rows != image.count or cursor + image.count > len(at):
                raise Refused("the image's tokens do not match its features; this model's chat template may "
                              "not support images", field)
            for i, token in zip(at[cursor:cursor + image.count], ids):
                out[i] = token
            cursor += image.count
        return out

    def run(self, work):
        """work() in the tower's thread."""
        return self._tower_thread.submit(work).result()

    def image_rows(self, tokens: list[int]) -> list[ImageRows]:
        """The features of every image whose ids are in tokens (placed by place())."""
        with self._lock:
            return [self.rows[t] for t in dict.fromkeys(t for t in tokens if t >= FIRST) if t in self.rows]

    def _image(self, field: str, part: dict[str, Any]) -> _Image:
        sha = part.get("sha256")
        if not isinstance(sha, str) or not isinstance(part.get("data"), bytes):
            raise Refused("an image part needs its sha256 and data bytes", field)
        with self._lock:
            if sha in self.images:
                self.images.move_to_end(sha)
                return self.images[sha]
        picture = _decode(part["data"], field)
        expansion = self.run(lambda: self.tower.expansion(picture))
        image = _Image(picture, expansion, expansion.count(self.tower.image_token))
        with self._lock:
            self.images[sha] = image
            while len(self.images) > self.remembered:
                self.images.popitem(last=False)
        return image


def _decode(data: bytes, field: str):
    """The image as mlx-vlm opens it (EXIF orientation applied, RGB)."""
    from mlx_vlm.utils import load_image

    try:
        return load_image(io.BytesIO(data))
    except Exception as exc:  # PIL raises several kinds for a file it cannot read
        raise Refused(f"the image cannot be decoded ({exc}); send a PNG, JPEG, WebP or GIF file", field) from None
