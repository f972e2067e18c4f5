"""What every dialect's embeddings and rerank endpoints share (a floor under api/openai, api/ollama, api/rerank):
the helper the engine serves of a kind, the checks of a request's inputs, and embeddings from the wire's bytes.

The engine checks again (it is the trust boundary); these checks answer in the dialect's own names first.
"""

from __future__ import annotations

import base64
import sys
from array import array
from typing import Any

import ipc
from api.engine_client import EngineClient
from api.errors import InvalidRequest, ModelNotFound
from api.request_checks import MODEL_ALIAS
from api.request_fields import TOKEN_ID_MAX

SETTING = {"embedding": "EMBEDDING_MODEL", "rerank": "RERANK_MODEL"}
INFO_TIMEOUT = 2.0


async def served_helper(engine: EngineClient, kind: str) -> ipc.HelperState:
    """The helper of this kind the engine serves, from its last Info (asked again when stale); a 404 naming the
    setting when none is configured."""
    info = engine.last_info
    if info is None or engine.stale:
        info = await engine.info(INFO_TIMEOUT)
    for helper in info.helpers:
        if helper.kind == kind:
            return helper
    raise ModelNotFound(f"this server serves no {kind} model: the operator sets {SETTING[kind]} (a folder, a repo id "
                        "or a zoo name; see docs/helpers.md) and restarts the engine", param="model")


def check_helper_model(model: str | None, helper: ipc.HelperState, param: str = "model") -> None:
    """The request's model must name the helper (or be "default"; None where the dialect lets it be absent)."""
    if model is None or model in (helper.name, MODEL_ALIAS) or model.removesuffix(":latest") == helper.name:
        return
    raise ModelNotFound(f"The model '{model}' does not exist. This server's {helper.kind} model is "
                        f"'{helper.name}' (also reachable as '{MODEL_ALIAS}').", param=param)


def check_count(n: int, limit: int, param: str, what: str) -> None:
    if n == 0:
        raise InvalidRequest(f"Invalid value for '{param}': it is empty; send at least one {what}.", param=param)
    if n > limit:
        raise InvalidRequest(f"Invalid value for '{param}': {n} {what}s exceed this server's limit of {limit} "
                             "(HELPER_MAX_INPUTS); send them in several requests.", param=param)


def texts_or_tokens(value: Any, param: str, tokens: bool) -> list[str | list[int]]:
    """An input as the dialects send it: a string, a list of strings, or (tokens) a list of token ids or a list of
    such lists; each string non-empty. A 400 naming the first wrong element otherwise."""
    if isinstance(value, str):
        items: list[Any] = [value]
        names = [param]
    elif tokens and isinstance(value, list) and value and all(_is_id(v) for v in value):
        return [list(value)]
    elif isinstance(value, list):
        items, names = value, [f"{param}[{i}]" for i in range(len(value))]
    else:
        raise InvalidRequest(f"Invalid value for '{param}': expected {_accepted(tokens)}.", param=param)
    for item, name in zip(items, names):
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(f"Invalid value for '{name}': an empty string; send text to embed.", param=name)
        elif not (tokens and isinstance(item, list) and item and all(_is_id(v) for v in item)):
            raise InvalidRequest(f"Invalid value for '{name}': expected {_accepted(tokens, item=True)}.", param=name)
    return items


def _is_id(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= TOKEN_ID_MAX


def _accepted(tokens: bool, item: bool = False) -> str:
    if not tokens:
        return "a non-empty string" if item else "a string or a list of strings"
    return ("a non-empty string or a non-empty list of token ids" if item else
            "a string, a list of strings, a list of token ids or a list of lists of token ids")


def floats(raw: bytes) -> list[float]:
    """An embedding from the wire (float32 little-endian) as numbers."""
    values = array("f", raw)
    if sys.byteorder != "little":
        values.byteswap()
    return values.tolist()


def base64_floats(raw: bytes) -> str:
    """OpenAI's encoding_format "base64": the float32 little-endian bytes, base64."""
    return base64.b64encode(raw).decode("ascii")
