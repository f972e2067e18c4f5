"""Image parts in a chat's messages (the canonical part the gateway sends: type "image", sha256, media_type, width,
height, data), and the refusal a model without vision gives them. No MLX here."""

from __future__ import annotations

from typing import Any

from engine.rank0.errors import Refused


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


def refuse_images(messages: list[dict[str, Any]], model: str) -> None:
    """Raise Refused naming the first image part, for a model that does not take images."""
    parts = image_parts(messages)
    if parts:
        raise Refused(f"model {model} does not take images; serve a vision-language model (docs/vision.md) or send "
                      "text only", parts[0][0])
