"""Anthropic's /v1/messages and /v1/messages/count_tokens, as methods of one AnthropicRoutes."""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.access import access_record
from api.anthropic.protocol import CountTokensRequest, MessagesRequest, TokenCount
from api.anthropic.render import MessageRenderer
from api.anthropic.serving import count_generate, messages_generate, new_message_id
from api.anthropic.streaming import message_stream
from api.bodies import check_message_count, json_response, read_request
from api.engine_client import EngineClient
from api.generation import CLIENT_CLOSED, respond, until_disconnect
from config import Settings

logger = logging.getLogger(__name__)

_messages_decoder = msgspec.json.Decoder(MessagesRequest)
_count_decoder = msgspec.json.Decoder(CountTokensRequest)


class AnthropicRoutes:
    """Holds the settings and the engine client the endpoints share."""

    def __init__(self, settings: Settings, engine: EngineClient) -> None:
        self.settings = settings
        self.engine = engine

    async def _read(self, request: Request, decoder: msgspec.json.Decoder[Any]) -> Any:
        req = await read_request(request, decoder, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        check_message_count(len(req.messages), self.settings.MAX_MESSAGES)
        return req

    async def messages(self, request: Request) -> Response:
        request_id = access_record(request).request_id = new_message_id()
        req: MessagesRequest = await self._read(request, _messages_decoder)
        msg = messages_generate(req, request_id, self.settings)
        logger.debug("%s prompt: %r", request_id, msg.messages)
        return await respond(request, self.engine, msg, MessageRenderer(request_id, self.settings.model_name, False),
                             stream=req.stream, timeout=self.settings.REQUEST_TIMEOUT, streamer=message_stream)

    async def count_tokens(self, request: Request) -> Response:
        """The engine counts a prompt only while admitting it, so the prompt is admitted for one token and
        the connection closed as soon as Started names the count (closing cancels the generation)."""
        record = access_record(request)
        record.request_id = new_message_id()
        req: CountTokensRequest = await self._read(request, _count_decoder)
        msg = count_generate(req, record.request_id, self.settings)

        async def count() -> int:
            gen = await self.engine.start(msg, self.settings.REQUEST_TIMEOUT)
            await gen.aclose()
            return gen.prompt_tokens

        tokens = await until_disconnect(request, count)
        if tokens is None:
            record.outcome = "client_disconnected"
            return Response(status_code=CLIENT_CLOSED)
        return json_response(TokenCount(input_tokens=tokens))
