"""OpenAI's /v1 endpoints (chat and legacy completions, models), as methods of one OpenAIRoutes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response

import ipc
from api.access import access_record
from api.bodies import check_message_count, json_response, read_request
from api.errors import APIError, EngineUnavailable, ModelNotFound
from api.generation import Renderer, respond
from api.images import take_images
from api.openai.protocol import ChatCompletionRequest, CompletionRequest, Model, ModelList
from api.openai.render import ChatRenderer, CompletionRenderer
from api.openai.serving import chat_generate, completion_generate, new_request_id
from api.request_checks import MODEL_ALIAS
from api.served import DialectRoutes
from config import Settings

logger = logging.getLogger(__name__)

# How long /health and /v1/models wait for the engine's Info.
INFO_TIMEOUT = 2.0

_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


class OpenAIRoutes(DialectRoutes):
    """OpenAI's /v1/chat/completions, /v1/completions and /v1/models, and /health."""

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, "chat", _chat_decoder, chat_generate, ChatRenderer)

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completion", _completion_decoder, completion_generate, CompletionRenderer)

    async def _generate(
        self,
        request: Request,
        kind: str,
        decoder: msgspec.json.Decoder[Any],
        translate: Callable[[Any, str, Settings], ipc.Generate],
        renderer: type[Renderer],
    ) -> Response:
        request_id = access_record(request).request_id = new_request_id(kind)
        req = await read_request(request, decoder, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        if kind == "chat":
            check_message_count(len(req.messages), self.settings.MAX_MESSAGES)
        settings = await self.served.fresh(req.model)
        msg = translate(req, request_id, settings)
        logger.debug("%s prompt: %r", request_id, msg.messages if kind == "chat" else msg.prompt)
        await take_images(request, msg.messages, settings)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await respond(
            request,
            self.engine,
            msg,
            renderer(request_id, settings.model_name, include_usage),
            stream=bool(req.stream),
            timeout=self.settings.REQUEST_TIMEOUT,
        )

    async def list_models(self, request: Request) -> Response:
        return json_response(ModelList(data=[await self._model()]))

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        served = (await self.served.fresh(model_id)).model_name
        if model_id not in (served, MODEL_ALIAS):
            raise ModelNotFound(f"The model '{model_id}' does not exist. This server serves '{served}'.")
        return json_response(await self._model())

    async def _model(self) -> Model:
        """The served model from fresh Info, or the last Info while the engine is briefly down (not while it
        switches to another model: the last Info names the one going)."""
        try:
            info = await self.engine.info(INFO_TIMEOUT)
        except APIError as exc:
            self.served.refuse_while_switching(exc)
            info = self.engine.last_info
            if info is None:
                raise EngineUnavailable(f"the model list is not known yet: {exc.message}") from None
        vision = info.facts is not None and info.facts.vision
        return Model(id=self.served.settings().model_name, created=info.created, context_length=info.context_length,
                     input_modalities=["text", "image"] if vision else ["text"])

