"""OpenAI's POST /v1/responses, as a method of ResponsesRoutes."""

from __future__ import annotations

import logging

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.access import access_record
from api.bodies import check_message_count, json_response, read_request
from api.generation import CLIENT_CLOSED, respond, until_disconnect
from api.images import take_images
from api.responses.protocol import ResponsesRequest
from api.responses.render import ResponseRenderer
from api.responses.serving import new_response_id, responses_generate
from api.responses.streaming import collect_response, response_stream
from api.served import DialectRoutes

logger = logging.getLogger(__name__)

_decoder = msgspec.json.Decoder(ResponsesRequest)


class ResponsesRoutes(DialectRoutes):
    """OpenAI's /v1/responses."""

    async def create(self, request: Request) -> Response:
        record = access_record(request)
        request_id = record.request_id = new_response_id()
        req = await read_request(request, _decoder, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        check_message_count(1 if isinstance(req.input, str) else len(req.input), self.settings.MAX_MESSAGES, "input")
        settings = await self.served.fresh(req.model)
        msg, toolset = responses_generate(req, request_id, settings)
        logger.debug("%s prompt: %r", request_id, msg.messages)
        await take_images(request, msg.messages, settings)
        renderer = ResponseRenderer(request_id, settings.model_name, req, toolset, msg.params.logprobs)
        timeout = self.settings.REQUEST_TIMEOUT
        if req.stream:
            return await respond(request, self.engine, msg, renderer, stream=True, timeout=timeout,
                                 streamer=response_stream)
        body = await until_disconnect(request, lambda: collect_response(self.engine, msg, renderer, timeout, record))
        if body is None:
            record.outcome = "client_disconnected"
            return Response(status_code=CLIENT_CLOSED)
        return json_response(body)
