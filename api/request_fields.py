"""Request fields every dialect shares, with their limits: sampling values and the function tool.

A dialect's protocol module declares its bodies with these types, so a limit means the same on
/v1, /v1/messages, /v1/responses and /api. A dialect whose range differs (Anthropic's temperature,
Ollama's) declares its own beside them.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

Temperature = Annotated[float, Meta(ge=0, le=2)]
TopP = Annotated[float, Meta(gt=0, le=1)]
Penalty = Annotated[float, Meta(ge=-2, le=2)]
MaxTokens = Annotated[int, Meta(ge=1)]
# Integers reach the engine as msgpack, which holds at most 64 bits; these bounds say so by name.
# OpenAI documents seed as a signed 64-bit integer.
Seed = Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
# No vocabulary comes near 2**31 tokens; the engine checks the model's own size.
TOKEN_ID_MAX = 2**31 - 1
TokenId = Annotated[int, Meta(ge=0, le=TOKEN_ID_MAX)]
TopK = Annotated[int, Meta(ge=-1, le=TOKEN_ID_MAX)]
TopLogprobs = Annotated[int, Meta(ge=0, le=20)]


class FunctionDefinition(Struct, kw_only=True):
    # absent fields stay absent: chat templates render the tools as JSON
    name: Annotated[str, Meta(min_length=1, max_length=64)]
    description: str | None | UnsetType = UNSET
    parameters: dict[str, Any] | None | UnsetType = UNSET
    strict: bool | None | UnsetType = UNSET


# A function tool as OpenAI spells it, which Ollama takes too and the chat templates render. (A comment, not a
# docstring: a docstring would become the schema's description in /openapi.json.)
class Tool(Struct, kw_only=True):
    type: Literal["function"]
    function: FunctionDefinition
