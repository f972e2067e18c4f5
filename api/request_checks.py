"""The checks every dialect makes of a request before it reaches the engine: the model asked for, a
generation limit, free-form JSON's depth, and parameters this server cannot honour (refused by name)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import msgspec
from msgspec import UNSET

from api.errors import InvalidRequest, ModelNotFound
from config import Settings

# Every dialect accepts this name for the served model.
MODEL_ALIAS = "default"
# Free-form JSON (tool schemas, response_format schemas, tool-call arguments) may nest this deep.
MAX_JSON_DEPTH = 64

# name -> (is the value harmless?, what we accept). Absent parameters are never checked.
Refusal = tuple[Callable[[Any], bool], str]


def refuse_unsupported(req: msgspec.Struct, refused: dict[str, Refusal]) -> None:
    """Raise InvalidRequest naming the first parameter present with a value we cannot honour."""
    for name, (harmless, accepted) in refused.items():
        value = getattr(req, name)
        if value is not UNSET and not harmless(value):
            shown = json.dumps(value)
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            raise InvalidRequest(
                f"Unsupported parameter: '{name}' = {shown} is not supported by this server ({accepted}).",
                param=name,
                code="unsupported_parameter",
            )


def check_model(model: str, settings: Settings) -> None:
    """Accept the served model's name and the alias "default"; anything else is a 404."""
    if model not in (settings.model_name, MODEL_ALIAS):
        raise ModelNotFound(
            f"The model '{model}' does not exist. This server serves '{settings.model_name}' "
            f"(also reachable as '{MODEL_ALIAS}').",
            param="model",
        )


def check_depth(value: Any, param: str) -> None:
    """Refuse free-form JSON (schemas, tool-call arguments) nested deeper than MAX_JSON_DEPTH: the engine
    turns it into grammars and templates, each of which recurses once per level."""
    level = [value]
    for _ in range(MAX_JSON_DEPTH):
        level = [v for item in level for v in (item.values() if isinstance(item, dict) else
                                                 item if isinstance(item, list) else ())]
        if not level:
            return
    raise InvalidRequest(f"Invalid value for '{param}': JSON nested deeper than {MAX_JSON_DEPTH} levels; "
                         "flatten it.", param=param)


def max_tokens_within(value: int | None, param: str, settings: Settings) -> int:
    """The client's limit, refused past MAX_TOKENS_LIMIT; with none, the server's own (server_max_tokens)."""
    if value is None:
        return server_max_tokens(settings)
    if value > settings.MAX_TOKENS_LIMIT:
        raise InvalidRequest(
            f"Invalid value for '{param}': {value} exceeds this server's limit of {settings.MAX_TOKENS_LIMIT}.",
            param=param,
        )
    return value


def server_max_tokens(settings: Settings) -> int:
    """What a request that sets no limit may generate, as OpenAI's endpoints have it: until the model stops or the
    context ends (MAX_TOKENS_LIMIT, or MAX_TOKENS_DEFAULT when the operator set one); the engine lowers it to
    what the KV budget holds (SamplingParams.max_tokens_default)."""
    return settings.MAX_TOKENS_DEFAULT or settings.MAX_TOKENS_LIMIT
