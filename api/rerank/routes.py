"""POST /v1/rerank, and vLLM's /rerank and /v2/rerank (Cohere's v2 client), served by the rerank helper."""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from api.access import access_record
from api.bodies import json_response, read_request
from api.helpers import served_helper
from api.rerank.protocol import RerankRequest
from api.rerank.serving import new_request_id, rerank_request, rerank_response
from api.served import DialectRoutes

_decoder = msgspec.json.Decoder(RerankRequest)


class RerankRoutes(DialectRoutes):
    async def rerank(self, request: Request) -> Response:
        request_id = access_record(request).request_id = new_request_id()
        req = await read_request(request, _decoder, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        helper = await served_helper(self.engine, "rerank")
        msg = rerank_request(req, request_id, helper, self.settings.HELPER_MAX_INPUTS)
        reply = await self.engine.rerank(msg, self.settings.REQUEST_TIMEOUT)
        return json_response(rerank_response(req, reply, helper.name))
