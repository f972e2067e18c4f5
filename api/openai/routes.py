"""OpenAI's /v1 endpoints (chat and legacy completions, models), as methods of one OpenAIRoutes."""

from __future__ import annotations

import logging
import uuid
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
from api.helpers import served_helper
from api.openai.protocol import ChatCompletionRequest, CompletionRequest, EmbeddingRequest, Model, ModelList
from api.openai.render import ChatRenderer, CompletionRenderer
from api.openai.serving import chat_generate, completion_generate, embed_request, embedding_list, new_request_id
from api.request_checks import MODEL_ALIAS
from api.served import DialectRoutes
from config import Settings

logger = logging.getLogger(__name__)

# How long /health and /v1/models wait for the engine's Info.
INFO_TIMEOUT = 2.0

_chat_decoder = msgspec.json.Decoder(ChatCompletionRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)
_embedding_decoder = msgspec.json.Decoder(EmbeddingRequest)


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
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return await respond(
            request,
            self.engine,
            msg,
            renderer(request_id, settings.model_name, include_usage),
            stream=bool(req.stream),
            timeout=self.settings.REQUEST_TIMEOUT,
        )

    async def embeddings(self, request: Request) -> Response:
        request_id = access_record(request).request_id = f"embd-{uuid.uuid4().hex}"
        req = await read_request(request, _embedding_decoder, self.settings.MAX_REQUEST_BYTES,
                                 self.settings.BODY_READ_TIMEOUT)
        helper = await served_helper(self.engine, "embedding")
        msg = embed_request(req, request_id, helper, self.settings.HELPER_MAX_INPUTS)
        reply = await self.engine.embed(msg, self.settings.REQUEST_TIMEOUT)
        return json_response(embedding_list(reply, req.encoding_format, helper.name))

    async def list_models(self, request: Request) -> Response:
        return json_response(ModelList(data=await self._models()))

    async def get_model(self, request: Request) -> Response:
        model_id = request.path_params["model_id"]
        await self.served.fresh(model_id)  # the engine may have switched to the model asked for
        models = await self._models()
        if model_id == MODEL_ALIAS:
            return json_response(models[0])
        for model in models:
            if model.id == model_id:
                return json_response(model)
        raise ModelNotFound(f"The model '{model_id}' does not exist. This server serves "
                            + ", ".join(f"'{m.id}'" for m in models) + ".")

    async def _models(self) -> list[Model]:
        """The served model, then the helper models beside it."""
        model = await self._model()
        info = self.engine.last_info
        helpers = info.helpers if info is not None else []
        return [model, *(Model(id=h.name, created=model.created, context_length=h.max_tokens, kind=h.kind)
                         for h in helpers)]

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
        return Model(id=self.served.settings().model_name, created=info.created, context_length=info.context_length)

