"""Anthropic's /v1/messages and /v1/messages/count_tokens, as methods of one AnthropicRoutes."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import access_record
from api.anthropic.protocol import CountTokensRequest, MessagesRequest, TokenCount
from api.anthropic.render import MessageRenderer
from api.anthropic.serving import count_generate, messages_generate, new_message_id
from api.anthropic.streaming import message_stream
from api.bodies import check_message_count, json_response, read_request
from api.generation import CLIENT_CLOSED, respond, until_disconnect
from api.images import take_images
from api.served import DialectRoutes

logger = logging.getLogger(__name__)

_messages_decoder = msgspec.json.Decoder(MessagesRequest)
_count_decoder = msgspec.json.Decoder(CountTokensRequest)


class AnthropicRoutes(DialectRoutes):
    """Anthropic's /v1/messages and /v1/messages/count_tokens."""

    async def _read(self, request: Request, decoder: msgspec.json.Decoder[Any]) -> Any:
        req = await read_request(request, decoder, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        check_message_count(len(req.messages), self.settings.MAX_MESSAGES)
        return req

    async def messages(self, request: Request) -> Response:
        request_id = access_record(request).request_id = new_message_id()
        req: MessagesRequest = await self._read(request, _messages_decoder)
        settings = await self.served.fresh(req.model)
        msg = messages_generate(req, request_id, settings)
        logger.debug("%s prompt: %r", request_id, msg.messages)
        await take_images(request, msg.messages, settings)
        return await respond(request, self.engine, msg, MessageRenderer(request_id, settings.model_name, False),
                             stream=req.stream, timeout=self.settings.REQUEST_TIMEOUT, streamer=message_stream)

    async def count_tokens(self, request: Request) -> Response:
        """The prompt create() would send, counted by the engine's tokenizer (rank 0 alone: no batch slot)."""
        record = access_record(request)
        record.request_id = new_message_id()
        req: CountTokensRequest = await self._read(request, _count_decoder)
        settings = await self.served.fresh(req.model)
        msg = count_generate(req, record.request_id, settings)
        await take_images(request, msg.messages, settings)
        # tool_choice "none" hides the tools from the prompt, as a generation does
        tokenize = ipc.Tokenize(kind="chat", messages=msg.messages, enable_thinking=msg.enable_thinking,
                                reasoning_effort=msg.reasoning_effort,
                                tools=msg.tools if msg.tool_choice != "none" else None)
        tokens = await until_disconnect(request, lambda: self.engine.tokenize(tokenize, self.settings.REQUEST_TIMEOUT))
        if tokens is None:
            record.outcome = "client_disconnected"
            return Response(status_code=CLIENT_CLOSED)
        record.prompt_tokens = len(tokens.tokens)
        return json_response(TokenCount(input_tokens=len(tokens.tokens)))
