"""Ollama's /api endpoints, as methods of one OllamaRoutes; app.py mounts them at /api."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

import ipc
from api.access import access_record, escape
from api.bodies import check_message_count, decode, json_response, read_body, require_json_from_browsers
from api.errors import APIError, EngineUnavailable, InvalidRequest, NotSupported
from api.generation import CLIENT_CLOSED, respond, until_disconnect
from api.ollama import models
from api.helpers import floats, served_helper
from api.ollama.protocol import (ChatRequest, EmbeddingsRequest, EmbeddingsResponse, EmbedRequest, EmbedResponse,
                                 GenerateRequest, ModelList, Options, RunningModels, ShowRequest, Version)
from api.ollama.render import NDJSON, OllamaRenderer, collect, ndjson_stream
from api.ollama.serving import (chat_generate, check_model, embed_request, embeddings_request, generate_generate,
                                new_request_id)
from api.served import DialectRoutes

logger = logging.getLogger(__name__)

# How long /api/tags, /api/show and /api/ps wait for the engine's Info.
INFO_TIMEOUT = 2.0
RUNNING = "Ollama is running"

_chat_decoder = msgspec.json.Decoder(ChatRequest)
_generate_decoder = msgspec.json.Decoder(GenerateRequest)
_show_decoder = msgspec.json.Decoder(ShowRequest)
_embed_decoder = msgspec.json.Decoder(EmbedRequest)
_embeddings_decoder = msgspec.json.Decoder(EmbeddingsRequest)


class _OptionKeys(msgspec.Struct):
    options: dict[str, msgspec.Raw] | None = None


_option_keys_decoder = msgspec.json.Decoder(_OptionKeys)


class OllamaRoutes(DialectRoutes):
    """Ollama's /api."""

    def routes(self) -> list[Route]:
        """The /api routes (to mount at /api), the refused ones included."""
        refused = [
            ("/pull", ["POST"], "pulling models"), ("/push", ["POST"], "pushing models"),
            ("/create", ["POST"], "creating models"), ("/copy", ["POST"], "copying models"),
            ("/delete", ["DELETE"], "deleting models"), ("/blobs/{digest}", ["POST", "HEAD"], "uploading blobs"),
        ]
        return [
            Route("/version", self.version, methods=["GET"]),
            Route("/tags", self.tags, methods=["GET"]),
            Route("/show", self.show, methods=["POST"]),
            Route("/ps", self.ps, methods=["GET"]),
            Route("/chat", self.chat, methods=["POST"]),
            Route("/generate", self.generate, methods=["POST"]),
            Route("/embed", self.embed, methods=["POST"]),
            Route("/embeddings", self.embeddings, methods=["POST"]),
            *[Route(path, self._refuse(what), methods=methods) for path, methods, what in refused],
        ]

    async def running(self, request: Request) -> Response:
        """GET and HEAD /: Ollama's clients probe the server with it."""
        return PlainTextResponse(RUNNING)

    async def version(self, request: Request) -> Response:
        return json_response(Version(version=models.OLLAMA_VERSION))

    async def tags(self, request: Request) -> Response:
        info = await self._info()
        return json_response(ModelList(models=[models.listed(info, self.served.settings()),
                                               *(models.listed_helper(h, info) for h in info.helpers)]))

    async def ps(self, request: Request) -> Response:
        info = await self._info()
        return json_response(RunningModels(models=[models.running(info, self.served.settings())]))

    async def show(self, request: Request) -> Response:
        req = await self._read(request, _show_decoder)
        model = req.model or req.name
        if not model:
            raise InvalidRequest("Missing required parameter: 'model'.", param="model")
        settings = await self.served.fresh(model)
        info = await self._info()
        helper = next((h for h in info.helpers if model in (h.name, h.name + ":latest")), None)
        if helper is not None:
            return json_response(models.show_helper(helper, info))
        check_model(model, settings)
        return json_response(models.show(info, self.served.settings()))

    async def chat(self, request: Request) -> Response:
        request_id = access_record(request).request_id = new_request_id()
        req: ChatRequest = await self._read(request, _chat_decoder)
        renderer = OllamaRenderer(request_id, req.model, chat=True)
        settings = await self.served.fresh(req.model)
        if not req.messages:
            check_model(req.model, settings)
            return json_response(renderer.loaded())
        check_message_count(len(req.messages), self.settings.MAX_MESSAGES)
        msg = chat_generate(req, request_id, settings)
        return await self._run(request, msg, renderer, req.stream is not False)

    async def generate(self, request: Request) -> Response:
        request_id = access_record(request).request_id = new_request_id()
        req: GenerateRequest = await self._read(request, _generate_decoder)
        renderer = OllamaRenderer(request_id, req.model, chat=False)
        settings = await self.served.fresh(req.model)
        if not req.prompt:
            check_model(req.model, settings)
            return json_response(renderer.loaded())
        msg = generate_generate(req, request_id, settings)
        return await self._run(request, msg, renderer, req.stream is not False)

    async def embed(self, request: Request) -> Response:
        started = time.perf_counter_ns()
        request_id = access_record(request).request_id = new_request_id()
        req: EmbedRequest = await self._read(request, _embed_decoder)
        helper = await served_helper(self.engine, "embedding")
        msg = embed_request(req, request_id, helper, self.settings.HELPER_MAX_INPUTS)
        if msg is None:
            return json_response(EmbedResponse(model=req.model, embeddings=[]))
        reply = await self.engine.embed(msg, self.settings.REQUEST_TIMEOUT)
        return json_response(EmbedResponse(model=req.model, embeddings=[floats(raw) for raw in reply.embeddings],
                                           total_duration=time.perf_counter_ns() - started,
                                           prompt_eval_count=reply.prompt_tokens))

    async def embeddings(self, request: Request) -> Response:
        """The legacy /api/embeddings: {"prompt"} -> {"embedding"}."""
        request_id = access_record(request).request_id = new_request_id()
        req: EmbeddingsRequest = await self._read(request, _embeddings_decoder)
        helper = await served_helper(self.engine, "embedding")
        msg = embeddings_request(req, request_id, helper)
        if msg is None:
            return json_response(EmbeddingsResponse(embedding=[]))
        reply = await self.engine.embed(msg, self.settings.REQUEST_TIMEOUT)
        return json_response(EmbeddingsResponse(embedding=floats(reply.embeddings[0])))

    def _refuse(self, what: str) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            raise NotSupported(f"{what} is not supported: this server serves one model, "
                               f"{self.served.settings().model_name}, loaded at start")

        return endpoint

    async def _run(self, request: Request, msg: ipc.Generate, renderer: OllamaRenderer, stream: bool) -> Response:
        logger.debug("%s prompt: %r", msg.request_id, msg.messages if msg.kind == "chat" else msg.prompt)
        timeout = self.settings.REQUEST_TIMEOUT
        if stream:
            return await respond(request, self.engine, msg, renderer, stream=True, timeout=timeout,
                                 streamer=ndjson_stream, media_type=NDJSON)
        record = access_record(request)
        body = await until_disconnect(request, lambda: collect(self.engine, msg, renderer, timeout, record))
        if body is None:
            record.outcome = "client_disconnected"
            return Response(status_code=CLIENT_CLOSED)
        return json_response(body)

    async def _read(self, request: Request, decoder: msgspec.json.Decoder[Any]) -> Any:
        """The body decoded, as every generation endpoint reads it; unknown options are logged at DEBUG."""
        require_json_from_browsers(request, self.settings.cors_origins)
        body = await read_body(request, self.settings.MAX_REQUEST_BYTES, self.settings.BODY_READ_TIMEOUT)
        req = decode(body, decoder)
        if logger.isEnabledFor(logging.DEBUG) and getattr(req, "options", None) is not None:
            _log_unknown_options(body)
        return req

    async def _info(self) -> ipc.Info:
        """Fresh Info, or the last one while the engine is briefly down."""
        try:
            return await self.engine.info(INFO_TIMEOUT)
        except APIError as exc:
            self.served.refuse_while_switching(exc)
            if self.engine.last_info is None:
                raise EngineUnavailable(f"the served model is not known yet: {exc.message}") from None
            return self.engine.last_info


def _log_unknown_options(body: bytes) -> None:
    keys = set((_option_keys_decoder.decode(body).options or {})) - set(Options.__struct_fields__)
    if keys:
        logger.debug("ignoring unknown options: %s", escape(", ".join(sorted(keys))))
