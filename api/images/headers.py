"""An image file's format and size, read from its header without decoding a pixel.

The format is sniffed from the magic bytes, never taken from a declared type. Each reader also walks the
file's structure to its end marker (PNG's IEND, JPEG's EOI, GIF's trailer, WebP's RIFF length), so a
truncated file is refused here rather than failing in the engine's decoder.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

MEDIA_TYPES = ("image/png", "image/jpeg", "image/webp", "image/gif")

_PNG = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


class ImageFormatError(Exception):
    """The bytes are not an image this server takes; the message says what is wrong (the caller names the field)."""


class ImageHeader(NamedTuple):
    media_type: str
    width: int
    height: int


def read_header(data: bytes) -> ImageHeader:
    """The media type and size of data (a whole PNG, JPEG, WebP or GIF file); raises ImageFormatError."""
    if data.startswith(_PNG):
        return _png(data)
    if data.startswith(b"\xff\xd8\xff"):
        return _jpeg(data)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return _webp(data)
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return _gif(data)
    raise ImageFormatError(f"unsupported image format (the file starts with {data[:8].hex(' ') or 'nothing'}); "
                           "send a PNG, JPEG, WebP or GIF file")


def _truncated(kind: str) -> ImageFormatError:
    return ImageFormatError(f"the {kind} file is truncated or damaged; send the whole file")


def _sized(kind: str, media_type: str, width: int, height: int) -> ImageHeader:
    if width < 1 or height < 1:
        raise ImageFormatError(f"the {kind} header declares a size of {width}x{height} pixels; send an image with "
                               "pixels")
    return ImageHeader(media_type, width, height)


def _png(data: bytes) -> ImageHeader:
    """Every chunk in bounds with a matching CRC, IHDR first, at least one IDAT, and IEND."""
    pos, size, seen_data = len(_PNG), None, False
    while pos + 12 <= len(data):
        length, kind = struct.unpack_from(">I4s", data, pos)
        end = pos + 12 + length
        if end > len(data):
            break
        body = data[pos + 8:end - 4]
        if zlib.crc32(kind + body) != struct.unpack_from(">I", data, end - 4)[0]:
            raise _truncated("PNG")
        if size is None:
            if kind != b"IHDR" or length != 13:
                raise _truncated("PNG")
            size = struct.unpack_from(">II", body)
        seen_data = seen_data or kind == b"IDAT"
        if kind == b"IEND":
            if not seen_data:
                raise _truncated("PNG")
            return _sized("PNG", "image/png", *size)
        pos = end
    raise _truncated("PNG")


def _jpeg(data: bytes) -> ImageHeader:
    """Segments in bounds up to the first scan, a frame header before it, and the end-of-image marker after."""
    pos, size = 2, None
    while pos + 4 <= len(data):
        if data[pos] != 0xFF:
            raise _truncated("JPEG")
        marker = data[pos + 1]
        if marker == 0xFF:  # fill byte
            pos += 1
            continue
        if 0xD0 <= marker <= 0xD7 or marker == 0x01:  # no length
            pos += 2
            continue
        length = struct.unpack_from(">H", data, pos + 2)[0]
        if length < 2 or pos + 2 + length > len(data):
            break
        if marker in _SOF:
            if length < 7:
                raise _truncated("JPEG")
            height, width = struct.unpack_from(">HH", data, pos + 5)
            size = (width, height)
        if marker == 0xDA:  # start of scan: coded data to the end marker (0xFF is stuffed within it)
            if size is None or data.find(b"\xff\xd9", pos + 2 + length) < 0:
                break
            return _sized("JPEG", "image/jpeg", *size)
        pos += 2 + length
    raise _truncated("JPEG")


def _webp(data: bytes) -> ImageHeader:
    """The RIFF length within the file, every chunk in bounds, and the size of its VP8X, VP8 or VP8L chunk."""
    riff_end = 8 + struct.unpack_from("<I", data, 4)[0]
    if riff_end > len(data) or riff_end < 12:
        raise _truncated("WebP")
    pos, size = 12, None
    while pos + 8 <= riff_end:
        kind, length = struct.unpack_from("<4sI", data, pos)
        body = data[pos + 8:pos + 8 + length]
        if pos + 8 + length > riff_end:
            raise _truncated("WebP")
        if size is None:
            size = _webp_size(kind, body)
        pos += 8 + length + (length & 1)
    if size is None:
        raise _truncated("WebP")
    return _sized("WebP", "image/webp", *size)


def _webp_size(kind: bytes, body: bytes) -> tuple[int, int] | None:
    if kind == b"VP8X" and len(body) >= 10:
        return int.from_bytes(body[4:7], "little") + 1, int.from_bytes(body[7:10], "little") + 1
    if kind == b"VP8L" and len(body) >= 5 and body[0] == 0x2F:
        bits = int.from_bytes(body[1:5], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if kind == b"VP8 " and len(body) >= 10 and body[3:6] == b"\x9d\x01\x2a":
        width, height = struct.unpack_from("<HH", body, 6)
        return width & 0x3FFF, height & 0x3FFF
    if kind in (b"VP8X", b"VP8L", b"VP8 "):
        raise _truncated("WebP")
    return None


def _gif(data: bytes) -> ImageHeader:
    """Every block in bounds up to the trailer; the size covers the screen and every frame placed on it."""
    if len(data) < 13:
        raise _truncated("GIF")
    width, height, flags = struct.unpack_from("<HHB", data, 6)
    pos = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
    frames = 0
    while pos < len(data):
        block = data[pos]
        if block == 0x3B:  # trailer
            if not frames:
                break
            return _sized("GIF", "image/gif", width, height)
        if block == 0x21:  # extension: label, then sub-blocks
            pos = _skip_sub_blocks(data, pos + 2)
        elif block == 0x2C:  # image: descriptor, local color table, LZW code size, sub-blocks
            if pos + 10 > len(data):
                break
            left, top, w, h, local = struct.unpack_from("<HHHHB", data, pos + 1)
            width, height = max(width, left + w), max(height, top + h)
            pos += 10 + (3 << ((local & 7) + 1) if local & 0x80 else 0)
            pos = _skip_sub_blocks(data, pos + 1)
            frames += 1
        else:
            break
    raise _truncated("GIF")


def _skip_sub_blocks(data: bytes, pos: int) -> int:
    """The position after a run of sub-blocks (length byte, bytes) ending with a zero length; past the end if cut."""
    while pos < len(data):
        length = data[pos]
        pos += 1 + length
        if length == 0:
            return pos
    return len(data) + 1
