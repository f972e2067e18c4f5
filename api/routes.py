"""The HTTP endpoints: OpenAI's /v1 routes and /health, as methods of one Gateway."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api import health
from api.access import access_record
from api.decoding import decode, read_body, require_json
from api.engine_client import EngineClient
from api.errors import APIError, EngineUnavailable, InvalidRequest, ModelNotFound
from api.generation import ChatShape, CompletionShape, Shape, respond
from api.schemas import ChatCompletionRequest, CompletionRequest, Model, ModelList, encode
from api.translate import MODEL_ALIAS, chat_generate, completion_generate, new_request_id
from config import Settings

logger = logging.getLogger(__name__)

# How long /health and /v1/models wait for the engine's Info.
INFO_TIMEOUT = 2.0

_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def json_response(obj: object, status_code: int = 200) -> Response:
    return Response(encode(obj), status_code=status_code, media_type="application/json")


class Gateway:
    """Holds the settings and the engine client the endpoints share."""

    def __init__(self, settings: Settings, engine: EngineClient) -> None:
        self.settings = settings
        self.engine = engine
        self.started = time.monotonic()

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat", _chat_decoder, chat_generate, ChatShape)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion", _completion_decoder, completion_generate, CompletionShape)

    async def _generate(
        self,
        request: Request,
        kind: str,
        decoder: msgspec.json.Decoder[Any],
        translate: Callable[[Any, str, Settings], ipc.Generate],
        shape: type[Shape],
    ) -> Response:
        request_id = access_record(request).request_id = new_request_id(kind)
        require_json(request)
        body = await read_body(request, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        req = decode(body, decoder)
        if kind == "chat" and len(req.messages) > self.settings.MAX_MESSAGES:
            # the body limit bounds bytes; this bounds the chat template's work on rank 0
            raise InvalidRequest(f"Invalid value for 'messages': {len(req.messages)} messages exceed this server's "
                                 f"limit of {self.settings.MAX_MESSAGES} (MAX_MESSAGES).", param="messages")
        msg = translate(req, request_id, self.settings)
        logger.debug("%s prompt: %r", request_id, msg.messages if kind == "chat" else msg.prompt)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await respond(
            request,
            self.engine,
            msg,
            shape(request_id, self.settings.model_name, include_usage),
            stream=bool(req.stream),
            timeout=self.settings.REQUEST_TIMEOUT,
        )

    async def list_models(self, request: Request) -> Response:
        return json_response(ModelList(data=[await self._model()]))

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        if model_id not in (self.settings.model_name, MODEL_ALIAS):
            raise ModelNotFound(f"The model '{model_id}' does not exist. This server serves '{self.settings.model_name}'.")
        return json_response(await self._model())

    async def health(self, request: Request) -> Response:
        """200 only when the engine answers and its step loop and every rank are progressing."""
        status, body = await health.check(self.engine, self.settings, self.started)
        return json_response(body, status)

    async def _model(self) -> Model:
        """The served model from fresh Info, or the last Info while the engine is briefly down."""
        try:
            info = await self.engine.info(INFO_TIMEOUT)
        except APIError as exc:
            info = self.engine.last_info
            if info is None:
                raise EngineUnavailable(f"the model list is not known yet: {exc.message}") from None
        return Model(id=self.settings.model_name, created=info.created, context_length=info.context_length)

