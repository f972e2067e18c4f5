"""vLLM's POST /tokenize and /detokenize: a prompt or a chat as the engine tokenises it, and ids back to text.

A chat is rendered by the engine exactly as a chat completion's prompt would be (same messages, same
tools, same template), so a tokenize count equals the chat endpoint's usage.prompt_tokens. Rank 0
answers both on its own: no plan, no other rank, no slot in the batch.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Struct
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import access_record
from api.bodies import ParamError, check_message_count, decode, json_response, read_body, read_request, require_json
from api.errors import InvalidRequest
from api.generation import CLIENT_CLOSED, until_disconnect
from api.images import take_images
from api.openai.protocol import ChatMessage
from api.openai.serving import engine_message, engine_tools
from api.request_checks import Refusal, check_model, refuse_unsupported
from api.request_fields import TokenId, Tool
from api.served import DialectRoutes
from config import Settings

# What chat_template_kwargs may hold: the switches the chat endpoint itself can set.
TEMPLATE_KWARGS = {"enable_thinking"}

# ---------------------------------------------------------------- requests and responses (vLLM's names)


class TokenizeCompletionRequest(Struct, kw_only=True):
    """A prompt tokenised as /v1/completions would tokenise it."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(Struct, kw_only=True):
    """A chat rendered by the model's chat template, then tokenised, as /v1/chat/completions would."""

    model: str | None = None
    messages: Annotated[list[ChatMessage], Meta(min_length=1)]
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    continue_final_message: bool = False
    add_special_tokens: bool = False
    chat_template: Any = UNSET
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: Any = UNSET
    mm_processor_kwargs: Any = UNSET
    tools: Annotated[list[Tool], Meta(max_length=128)] | None = None

    def __post_init__(self) -> None:
        if self.continue_final_message and self.add_generation_prompt:
            raise ParamError("continue_final_message and add_generation_prompt cannot both be true; set "
                             "add_generation_prompt to false to continue the last message", "continue_final_message")


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(Struct, kw_only=True):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(Struct, kw_only=True):
    model: str | None = None
    tokens: list[TokenId]


class DetokenizeResponse(Struct, kw_only=True):
    prompt: str


REFUSED_TOKENIZE_CHAT: dict[str, Refusal] = {
    "chat_template": (lambda v: v is None, "the model's own chat template renders every chat"),
    "media_io_kwargs": (lambda v: v in (None, {}), "text only"),
    "mm_processor_kwargs": (lambda v: v in (None, {}), "text only"),
}

_keys_decoder = msgspec.json.Decoder(dict[str, msgspec.Raw])
_completion_decoder = msgspec.json.Decoder(TokenizeCompletionRequest)
_chat_decoder = msgspec.json.Decoder(TokenizeChatRequest)
_detokenize_decoder = msgspec.json.Decoder(DetokenizeRequest)

# ---------------------------------------------------------------- translation


def tokenize_message(req: TokenizeRequest, settings: Settings) -> ipc.Tokenize:
    """The engine's Tokenize for req; raises InvalidRequest (400) or ModelNotFound (404)."""
    if req.model is not None:
        check_model(req.model, settings)
    strs = bool(req.return_token_strs)
    if isinstance(req, TokenizeCompletionRequest):
        return ipc.Tokenize(kind="completion", prompt=req.prompt, add_special_tokens=req.add_special_tokens,
                            return_token_strs=strs)
    refuse_unsupported(req, REFUSED_TOKENIZE_CHAT)
    return ipc.Tokenize(
        kind="chat",
        messages=[engine_message(m, f"messages[{i}]") for i, m in enumerate(req.messages)],
        tools=engine_tools(req.tools),
        enable_thinking=_enable_thinking(req.chat_template_kwargs),
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        add_special_tokens=req.add_special_tokens,
        return_token_strs=strs,
    )


def detokenize_message(req: DetokenizeRequest, settings: Settings) -> ipc.Detokenize:
    if req.model is not None:
        check_model(req.model, settings)
    return ipc.Detokenize(tokens=req.tokens)


def _enable_thinking(kwargs: dict[str, Any] | None) -> bool | None:
    """chat_template_kwargs may switch thinking, as the chat endpoint can; other template variables would
    render a prompt no chat completion can have, so they are refused by name."""
    for key in kwargs or {}:
        if key not in TEMPLATE_KWARGS:
            raise InvalidRequest(
                f"Unsupported parameter: 'chat_template_kwargs.{key}' is not supported by this server (only "
                f"{', '.join(sorted(TEMPLATE_KWARGS))}).", param=f"chat_template_kwargs.{key}",
                code="unsupported_parameter")
    value = (kwargs or {}).get("enable_thinking")
    if value is not None and not isinstance(value, bool):
        raise InvalidRequest("Invalid value for 'chat_template_kwargs.enable_thinking': expected a boolean.",
                             param="chat_template_kwargs.enable_thinking")
    return value


async def read_tokenize_request(request: Request, settings: Settings) -> TokenizeRequest:
    """The body as vLLM reads it: a chat when it has messages, else a completion prompt."""
    require_json(request)
    body = await read_body(request, settings.MAX_REQUEST_BYTES, settings.BODY_READ_TIMEOUT)
    keys = decode(body, _keys_decoder)
    if "messages" in keys and "prompt" in keys:
        raise InvalidRequest("Invalid request: send either 'prompt' (a text) or 'messages' (a chat), not both.",
                             param="prompt")
    if "messages" not in keys:
        return decode(body, _completion_decoder)
    req = decode(body, _chat_decoder)
    check_message_count(len(req.messages), settings.MAX_MESSAGES)
    return req


# ---------------------------------------------------------------- endpoints


class TokenRoutes(DialectRoutes):
    """POST /tokenize and /detokenize."""

    async def tokenize(self, request: Request) -> Response:
        req = await read_tokenize_request(request, self.settings)
        settings = await self.served.fresh(req.model)
        msg = tokenize_message(req, settings)
        await take_images(request, msg.messages, settings)
        reply = await until_disconnect(request, lambda: self.engine.tokenize(msg, self.settings.REQUEST_TIMEOUT))
        if reply is None:
            return _client_gone(request)
        return json_response(TokenizeResponse(count=len(reply.tokens), max_model_len=reply.max_model_len,
                                              tokens=reply.tokens, token_strs=reply.token_strs))

    async def detokenize(self, request: Request) -> Response:
        req = await read_request(request, _detokenize_decoder, self.settings.MAX_REQUEST_BYTES,
                                 self.settings.BODY_READ_TIMEOUT)
        msg = detokenize_message(req, await self.served.fresh(req.model))
        reply = await until_disconnect(request, lambda: self.engine.detokenize(msg, self.settings.REQUEST_TIMEOUT))
        if reply is None:
            return _client_gone(request)
        return json_response(DetokenizeResponse(prompt=reply.prompt))


def _client_gone(request: Request) -> Response:
    access_record(request).outcome = "client_disconnected"
    return Response(status_code=CLIENT_CLOSED)
