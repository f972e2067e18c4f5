"""Where an image stands in a message before it is checked: an ImageRef in the message's content parts.

Dialects build a message's content from text and ImageRefs with message_content, which keeps today's plain
string when no image is among them, so a text-only conversation reaches the engine exactly as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from api.errors import InvalidRequest

# the roles whose content may hold an image (a tool's result may be a screenshot)
IMAGE_ROLES = ("user", "tool")


@dataclass(frozen=True)
class ImageRef:
    """An image as a client sent it: a URL (data: or http(s)) or bare base64, and the field it came in."""

    kind: Literal["url", "base64"]
    value: str
    param: str  # e.g. messages[0].content[1].image_url: what a 4xx about this image names

    def __repr__(self) -> str:  # prompts are logged at DEBUG: never a megabyte of base64
        return f"ImageRef({self.kind}, {len(self.value)} chars, {self.param})"


def message_content(items: list[str | ImageRef]) -> str | list[Any]:
    """The content of a message holding items in order: the texts joined by newlines when there is no image,
    else a list of text parts and ImageRefs in their order."""
    if not any(isinstance(item, ImageRef) for item in items):
        return "\n".join(items)  # type: ignore[arg-type]
    return [item if isinstance(item, ImageRef) else {"type": "text", "text": item} for item in items]


def check_image_role(role: str, param: str) -> None:
    """Refuse an image in a system or assistant message, naming its field."""
    if role not in IMAGE_ROLES:
        raise InvalidRequest(f"Invalid value for '{param}': images are taken in user messages and tool results "
                             f"only, and this message's role is {role!r}; move the image to a user message.",
                             param=param)
