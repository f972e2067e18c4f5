"""The Starlette application: routes, the API key, the access log and each dialect's error envelope."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Mount, Route

from api.anthropic.routes import AnthropicRoutes
from api.access import AccessLog, access_record, escape, request_id_header
from api.auth import api_key_guard, ops_guard
from api.cors import cors_middleware
from api.dashboard import Dashboard
from api.dialects import error_body
from api.bodies import json_response
from api.engine_client import SocketEngineClient
from api.errors import APIError, MethodNotAllowed, NotFound
from api.generation import CLIENT_CLOSED
from api.health import Health
from api.metrics import Metrics
from api.ollama.routes import OllamaRoutes
from api.openai.routes import OpenAIRoutes
from api.openai.tokens import TokenRoutes
from api.openapi import openapi_route
from api.rerank.routes import RerankRoutes
from api.responses.routes import ResponsesRoutes
from api.served import Served
from config import Settings

logger = logging.getLogger(__name__)


def create_app(settings: Settings) -> Starlette:
    """The gateway for settings: /v1 (OpenAI's chat, completions and Responses APIs, Anthropic's Messages API),
    /api (Ollama's) and vLLM's /tokenize and /detokenize, behind API_KEY when set; /health, /metrics, /dashboard."""
    engine = SocketEngineClient(settings.socket_path, max_frame=settings.MAX_FRAME_BYTES)
    served = Served(settings, engine)  # the served model's name follows the engine's, through a switch
    openai = OpenAIRoutes(served, engine)
    anthropic = AnthropicRoutes(served, engine)
    responses = ResponsesRoutes(served, engine)
    ollama = OllamaRoutes(served, engine)
    tokens = TokenRoutes(served, engine)
    rerank = RerankRoutes(served, engine)
    metrics = Metrics(engine)
    ops = ops_guard(settings)
    v1 = [
        Route("/chat/completions", openai.chat_completions, methods=["POST"]),
        Route("/completions", openai.completions, methods=["POST"]),
        Route("/responses", responses.create, methods=["POST"]),
        Route("/embeddings", openai.embeddings, methods=["POST"]),
        Route("/rerank", rerank.rerank, methods=["POST"]),
        Route("/models", openai.list_models, methods=["GET"]),
        Route("/models/{model_id:path}", openai.get_model, methods=["GET"]),
    ]
    auth = api_key_guard(settings)
    # matched before the /v1 mount, so that Anthropic's x-api-key header counts for these two only
    anthropic_auth = api_key_guard(settings, x_api_key=True)
    return Starlette(
        routes=[
            # open; its details only where the ops routes are open too (no key, or PROTECT_OPS_ROUTES=false)
            Route("/health", Health(settings, engine, detailed=not ops).endpoint, methods=["GET"]),
            Route("/health/detail", Health(settings, engine).endpoint, methods=["GET"], middleware=ops),
            openapi_route(served),
            Route("/v1/messages", anthropic.messages, methods=["POST"], middleware=anthropic_auth),
            Route("/v1/messages/count_tokens", anthropic.count_tokens, methods=["POST"], middleware=anthropic_auth),
            Mount("/v1", routes=v1, middleware=auth),
            Mount("/api", routes=ollama.routes(), middleware=auth),
            # Ollama's clients probe the server's root (HEAD comes with GET)
            Route("/", ollama.running, methods=["GET"]),
            # vLLM's paths: at the root, not under /v1
            Route("/tokenize", tokens.tokenize, methods=["POST"], middleware=auth),
            Route("/detokenize", tokens.detokenize, methods=["POST"], middleware=auth),
            # vLLM's and Jina's rerank path, and Cohere's v2 client's
            Route("/rerank", rerank.rerank, methods=["POST"], middleware=auth),
            Route("/v2/rerank", rerank.rerank, methods=["POST"], middleware=auth),
            Route("/metrics", metrics.endpoint, methods=["GET"], middleware=ops),
            *Dashboard(settings, engine, metrics).routes(ops),
        ],
        # the access log is outermost: it times and names every answer, CORS preflights included
        middleware=[Middleware(AccessLog, observer=metrics), *cors_middleware(settings)],
        exception_handlers={
            APIError: _api_error,
            HTTPException: _http_error,
            ClientDisconnect: _client_gone,
            Exception: _server_error,
        },
    )


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, APIError)
    record = access_record(request)
    record.outcome = record.outcome or exc.code or exc.type  # the access line and dashboard name the error
    if exc.status >= 500:
        logger.warning("%s %s: %s", record.request_id, escape(request.url.path), escape(exc.message))
    return _render(exc, path=request.url.path)


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own 404 (unknown route) and 405 (wrong method), as errors of our hierarchy."""
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        err: APIError = NotFound(f"Invalid URL ({request.method} {request.url.path})")
    elif exc.status_code == 405:
        err = MethodNotAllowed(f"Method {request.method} is not allowed for {request.url.path}")
    else:
        err = APIError(exc.detail)
        err.status, err.type = exc.status_code, "invalid_request_error"
    return _render(err, exc.headers, request.url.path)


def _render(err: APIError, headers: Mapping[str, str] | None = None, path: str = "") -> Response:
    response = json_response(error_body(err, path), err.status)
    response.headers.update(headers or {})
    response.headers.update(err.headers)
    return response


async def _client_gone(request: Request, exc: Exception) -> Response:
    """The client left while sending its body: nobody reads the answer, the access log does."""
    access_record(request).outcome = "client_disconnected"
    return Response(status_code=CLIENT_CLOSED)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A bug: answer with an OpenAI error object; Starlette re-raises so the traceback is logged.

    Starlette sends this answer outside every middleware, so it names the request itself.
    """
    response = _render(APIError("internal server error"), path=request.url.path)
    name, value = request_id_header(access_record(request))
    response.headers[name.decode()] = value.decode("latin-1")
    return response
