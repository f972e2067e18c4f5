"""Real image files for the image tests, written by Pillow (the library the engine's vision path decodes
with), and the request shapes each dialect's clients send them in."""

from __future__ import annotations

import base64
import io
import random
import struct
import zlib

from PIL import Image


def image_file(fmt: str, size: tuple[int, int] = (3, 2), **options: object) -> bytes:
    """A small image of size in fmt (PNG, JPEG, WEBP, GIF, BMP) as Pillow writes it."""
    img = Image.new("RGB", size, (200, 30, 60))
    img.putpixel((0, 0), (0, 0, 255))
    out = io.BytesIO()
    img.save(out, fmt, **options)
    return out.getvalue()


def noise_png(size: tuple[int, int]) -> bytes:
    """A PNG of random pixels: it barely compresses, so its bytes grow with its size."""
    pixels = random.Random(0).randbytes(size[0] * size[1] * 3)
    out = io.BytesIO()
    Image.frombytes("RGB", size, pixels).save(out, "PNG")
    return out.getvalue()


def screenshot_png(size: tuple[int, int] = (3840, 2160), busy_rows: int = 600) -> bytes:
    """A 4K screenshot as a PNG of about 7 MB (about 9.3 MB as base64): flat window chrome around a band of
    photo-like rows that barely compress."""
    width, height = size
    busy = random.Random(1).randbytes(width * busy_rows * 3)
    flat = bytes([236, 236, 236]) * (width * (height - busy_rows))
    out = io.BytesIO()
    Image.frombytes("RGB", size, busy + flat).save(out, "PNG", compress_level=1)
    return out.getvalue()


def animated_gif(size: tuple[int, int] = (4, 3), frames: int = 3) -> bytes:
    images = [Image.new("P", size, i * 40) for i in range(frames)]
    out = io.BytesIO()
    images[0].save(out, "GIF", save_all=True, append_images=images[1:], duration=50, loop=0)
    return out.getvalue()


def png_bomb(width: int, height: int) -> bytes:
    """A valid PNG of a few dozen bytes whose header declares width x height pixels: its one IDAT holds only the
    start of the image (a decoder would allocate the whole before it found out)."""
    def chunk(kind: bytes, body: bytes) -> bytes:
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\x00" * 64))
            + chunk(b"IEND", b""))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{b64(data)}"


PNG = image_file("PNG", (3, 2))
JPEG = image_file("JPEG", (5, 4))
WEBP = image_file("WEBP", (7, 6))
GIF = image_file("GIF", (2, 9))
