"""The API's own OpenAPI 3.1 document, generated from the msgspec Structs it decodes and encodes.

Served at /openapi.json; schemathesis tests the running API against it. Everything a route
can answer is listed, errors included, so a response outside the document is a bug.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from api.anthropic import protocol as anthropic
from api.openai import protocol, tokens
from api.rerank import protocol as rerank_protocol
from api.responses import protocol as responses_protocol
from api.ollama import protocol as ollama
from api.ollama.models import OLLAMA_VERSION
from api.ollama.render import NDJSON
from api.ollama.serving import LATEST
from api.request_checks import MODEL_ALIAS
from api.served import Served
from config import Settings
from config.keys import api_keys

REF = "#/components/schemas/{name}"
# Ollama's schemas share names with OpenAI's (Message, ModelList, ...): theirs are prefixed
OLLAMA = "Ollama"


class ErrorDetail(Struct, kw_only=True):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct, kw_only=True):
    """Every error the API answers with (OpenAI's error object)."""

    error: ErrorDetail


class AnthropicErrorDetail(Struct, kw_only=True):
    type: str
    message: str


class AnthropicErrorResponse(Struct, kw_only=True):
    """Every error of the /v1/messages routes, an answer's body or a stream's error event (Anthropic's shape)."""

    type: str
    error: AnthropicErrorDetail


# status -> when it happens; generation routes can answer all of them
_GENERATION_ERRORS = {
    "400": "invalid request: a bad parameter (named in error.param), or a prompt beyond the context",
    "404": "model not found: only the served model's name and 'default' are accepted",
    "408": "the request body did not arrive within BODY_READ_TIMEOUT",
    "413": "request body larger than MAX_REQUEST_BYTES",
    "415": "the body was not sent with Content-Type: application/json",
    "429": "the engine's queue is full (OpenAI's rate_limit_exceeded); retry after Retry-After seconds",
    "500": "the generation failed",
    "503": "the engine is unavailable (restarting or stopped); retry after Retry-After seconds",
    "504": "the request did not finish within REQUEST_TIMEOUT",
}
# /tokenize and /detokenize: no generation, so no queue (429) and no stream
_TOKEN_ERRORS = {status: text for status, text in _GENERATION_ERRORS.items() if status != "429"} | {
    "400": "invalid request: a bad parameter (named in error.param), or a token id outside the vocabulary",
    "500": "the engine failed to answer",
}
# the helper models' routes: 404 also when no helper of the kind is configured
_HELPER_ERRORS = _TOKEN_ERRORS | {
    "404": "no helper model of this kind is configured (EMBEDDING_MODEL, RERANK_MODEL), or model names another",
    "400": "invalid request: a bad input (named in error.param), or one longer than the helper takes",
}
# model listings before the engine has said which model it serves
_UNAVAILABLE = {"503": "the engine is unavailable and its model is not known yet"}
_RETRY_AFTER = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "string"}}}
_REQUEST_ID = {"x-request-id": {"description": "the request's id (a generation's completion id), also in api.log",
                                "required": True, "schema": {"type": "string"}}}


def _json(ref: str) -> dict[str, Any]:
    return {"application/json": {"schema": {"$ref": REF.format(name=ref)}}}


def _error(description: str, status: str, schema: str = "ErrorResponse") -> dict[str, Any]:
    out: dict[str, Any] = {"description": description, "content": _json(schema)}
    if status in ("429", "503"):
        out["headers"] = _RETRY_AFTER
    return out


def _openai_events(chunk: str) -> dict[str, Any]:
    """OpenAPI 3.1: the schema of one event; its data is a JSON chunk, an error, or [DONE]."""
    return {
        "type": "object",
        "properties": {"data": {"anyOf": [
            {"const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": {
                "anyOf": [{"$ref": REF.format(name=chunk)}, {"$ref": REF.format(name="ErrorResponse")}]}},
        ]}},
        "required": ["data"],
    }


# Anthropic's named events: `event: <type>`, then data, a JSON object whose "type" repeats the name
_NAMED_EVENTS = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json",
                 "contentSchema": {"type": "object", "properties": {"type": {"type": "string"}}, "required": ["type"]}},
    },
    "required": ["event", "data"],
}


# one event of a Responses stream: its type on the `event:` line, then the event as JSON (no [DONE])
_RESPONSE_EVENTS = {
    "type": "object",
    "properties": {
        "event": {"type": "string"},
        "data": {"type": "string", "contentMediaType": "application/json", "contentSchema": {
            "type": "object",
            "properties": {"type": {"type": "string"}, "sequence_number": {"type": "integer", "minimum": 0},
                           "response": {"$ref": REF.format(name="Response")}},
            "required": ["type", "sequence_number"],
        }},
    },
    "required": ["event", "data"],
}


def _generation(summary: str, request: str, response: str, events: dict[str, Any] | None, auth: bool,
                example: dict[str, Any], envelope: str = "ErrorResponse") -> dict[str, Any]:
    content = _json(response)
    if events is not None:
        content["text/event-stream"] = {"schema": events}
    responses: dict[str, Any] = {
        "200": {
            "description": "the result; with stream=true, Server-Sent Events" if events else "the result",
            "content": content,
        },
        **{status: _error(text, status, envelope) for status, text in _GENERATION_ERRORS.items()},
    }
    if auth:
        responses["401"] = _error("missing or wrong API key", "401", envelope)
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": REF.format(name=request)}, "example": example}}},
        "responses": responses,
    }


def _post(summary: str, request: dict[str, Any], response: str, errors: dict[str, str], auth: bool,
          example: dict[str, Any], error: str = "ErrorResponse") -> dict[str, Any]:
    operation = _get(summary, {"description": "the answer", "content": _json(response)}, errors, auth, error)
    operation["requestBody"] = {"required": True, "content": {"application/json": {"schema": request,
                                                                                  "example": example}}}
    return operation


def _get(summary: str, ok: dict[str, Any], errors: dict[str, str], auth: bool = False,
         error: str = "ErrorResponse") -> dict[str, Any]:
    responses = {"200": ok, **{status: _error(text, status, error) for status, text in errors.items()}}
    if auth:
        responses["401"] = _error("missing or wrong API key", "401", error)
    return {"summary": summary, "responses": responses}


def _ollama_generation(summary: str, request: str, response: str, auth: bool,
                       example: dict[str, Any]) -> dict[str, Any]:
    """An Ollama generation: one JSON body with stream=false, NDJSON lines by default."""
    error = OLLAMA + "Error"
    line = {"anyOf": [{"$ref": REF.format(name=OLLAMA + response)}, {"$ref": REF.format(name=error)}]}
    responses: dict[str, Any] = {
        "200": {
            "description": "the whole answer with stream=false (and for a load call: no messages, or no prompt); "
                           "otherwise one JSON object a line, the last with done=true (or an error)",
            "content": {**_json(OLLAMA + response), NDJSON: {"schema": line}},
        },
        **{status: _error(text, status, error) for status, text in _GENERATION_ERRORS.items()},
    }
    if auth:
        responses["401"] = _error("missing or wrong API key", "401", error)
    return {
        "summary": summary,
        "requestBody": {"required": True, "content": {
            "application/json": {"schema": {"$ref": REF.format(name=OLLAMA + request)}, "example": example}}},
        "responses": responses,
    }


def _ollama_paths(settings: Settings, auth: bool, components: dict[str, Any]) -> dict[str, Any]:
    """Ollama's /api (model management answers 501 and is left out), and the probe at /."""
    structs = [ollama.ChatRequest, ollama.GenerateRequest, ollama.ShowRequest, ollama.ChatResponse,
               ollama.GenerateResponse, ollama.ModelList, ollama.RunningModels, ollama.ShowResponse,
               ollama.Version, ollama.Error, ollama.EmbedRequest, ollama.EmbedResponse, ollama.EmbeddingsRequest,
               ollama.EmbeddingsResponse]
    _, schemas = msgspec.json.schema_components(structs, ref_template=REF.format(name=OLLAMA + "{name}"))
    components.update({OLLAMA + name: schema for name, schema in schemas.items()})
    names = sorted({n + tag for n in (settings.model_name.removesuffix(LATEST), MODEL_ALIAS) for tag in ("", LATEST)})
    for name in ("ChatRequest", "GenerateRequest"):
        components[OLLAMA + name]["properties"]["model"] = {"type": "string", "enum": names}
    error = OLLAMA + "Error"
    body_errors = {k: v for k, v in _GENERATION_ERRORS.items() if k in ("400", "408", "413", "415")}
    show = _get("Describe the served model (capabilities, context length in model_info)", {
        "description": "the model", "content": _json(OLLAMA + "ShowResponse")},
        {**body_errors, "404": "model not found", **_UNAVAILABLE}, auth, error)
    show["requestBody"] = {"required": True, "content": {"application/json": {
        "schema": {"$ref": REF.format(name=OLLAMA + "ShowRequest")}, "example": {"model": settings.model_name}}}}
    return {
        "/": {"get": {"summary": "Ollama's liveness probe (never needs a key)", "responses": {"200": {
            "description": "the server answers", "content": {"text/plain": {"schema": {"const": "Ollama is running"}}}}}}},
        "/api/version": {"get": _get(f"The Ollama version this server speaks ({OLLAMA_VERSION})", {
            "description": "the version", "content": _json(OLLAMA + "Version")}, {}, auth, error)},
        "/api/tags": {"get": _get("List the served model", {
            "description": "the model list", "content": _json(OLLAMA + "ModelList")}, _UNAVAILABLE, auth, error)},
        "/api/ps": {"get": _get("The loaded model (always the served one)", {
            "description": "the running model", "content": _json(OLLAMA + "RunningModels")}, _UNAVAILABLE, auth,
            error)},
        "/api/show": {"post": show},
        "/api/chat": {"post": _ollama_generation(
            "Chat (Ollama)", "ChatRequest", "ChatResponse", auth,
            {"model": settings.model_name, "messages": [{"role": "user", "content": "hello"}],
             "options": {"num_predict": 8}})},
        "/api/generate": {"post": _ollama_generation(
            "Complete a prompt (Ollama)", "GenerateRequest", "GenerateResponse", auth,
            {"model": settings.model_name, "prompt": "Once upon a time", "stream": False,
             "options": {"num_predict": 8}})},
        "/api/embed": {"post": _post(
            "Embed inputs with the embedding model beside the served one (EMBEDDING_MODEL)",
            {"$ref": REF.format(name=OLLAMA + "EmbedRequest")}, OLLAMA + "EmbedResponse", _HELPER_ERRORS, auth,
            {"model": "default", "input": ["hello"]}, error)},
        "/api/embeddings": {"post": _post(
            "Embed one prompt (Ollama's legacy endpoint)", {"$ref": REF.format(name=OLLAMA + "EmbeddingsRequest")},
            OLLAMA + "EmbeddingsResponse", _HELPER_ERRORS, auth, {"model": "default", "prompt": "hello"}, error)},
    }


# every body /v1 and the token routes decode or encode, and the error envelopes they answer with
_STRUCTS = [
    protocol.ChatCompletionRequest,
    protocol.CompletionRequest,
    protocol.ChatCompletion,
    protocol.ChatCompletionChunk,
    protocol.Completion,
    protocol.ModelList,
    protocol.Model,
    protocol.EmbeddingRequest,
    protocol.EmbeddingList,
    rerank_protocol.RerankRequest,
    rerank_protocol.RerankResponse,
    responses_protocol.ResponsesRequest,
    responses_protocol.Response,
    tokens.TokenizeCompletionRequest,
    tokens.TokenizeChatRequest,
    tokens.TokenizeResponse,
    tokens.DetokenizeRequest,
    tokens.DetokenizeResponse,
    ErrorResponse,
    anthropic.MessagesRequest,
    anthropic.Message,
    anthropic.CountTokensRequest,
    anthropic.TokenCount,
    AnthropicErrorResponse,
]
_DESCRIPTION = ("OpenAI-compatible API (chat, completions, Responses) in front of a distributed "
                "MLX engine; Anthropic's Messages API and Ollama's /api over the same engine. Ollama's model management (/api/pull, "
                "/push, /create, /copy, /delete, /blobs) answers 501 with {\"error\": message}. Embeddings and rerank "
                "come from helper models beside the served one (EMBEDDING_MODEL, RERANK_MODEL), 404 without them.")


def openapi_document(settings: Settings) -> dict[str, Any]:
    """The OpenAPI document of an API started with settings."""
    components = _components(settings)
    auth = bool(api_keys(settings))
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "mlx-cluster-serve", "version": "1", "description": _DESCRIPTION},
        "paths": {**_generation_paths(settings, auth), **_model_paths(auth), **_token_paths(settings, auth),
                  **_helper_paths(auth), "/health": _health_path()},
        "components": {"schemas": components},
    }
    doc["paths"].update(_ollama_paths(settings, auth, components))
    _annotate(doc, auth)
    return doc


def _components(settings: Settings) -> dict[str, Any]:
    """The schemas of _STRUCTS and /health's body; `model` accepts exactly the served name and the alias
    (anything else is a 404)."""
    _, components = msgspec.json.schema_components(_STRUCTS, ref_template=REF)
    models = sorted({settings.model_name, MODEL_ALIAS})
    for name in ("ChatCompletionRequest", "CompletionRequest", "ResponsesRequest", "MessagesRequest",
                 "CountTokensRequest"):
        components[name]["properties"]["model"] = {"type": "string", "enum": models}
    for name in ("TokenizeCompletionRequest", "TokenizeChatRequest", "DetokenizeRequest"):
        components[name]["properties"]["model"] = {"anyOf": [{"type": "string", "enum": models}, {"type": "null"}],
                                                   "default": None}
    components["Health"] = {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "unavailable"]}, "api": {"type": "string"},
                       "engine": {"type": "string"}},
        "required": ["status"],
    }
    return components


def _generation_paths(settings: Settings, auth: bool) -> dict[str, Any]:
    """The routes that generate: OpenAI's chat, completions and Responses, and Anthropic's Messages."""
    return {
        "/v1/chat/completions": {"post": _generation(
            "Create a chat completion", "ChatCompletionRequest", "ChatCompletion", _openai_events("ChatCompletionChunk"), auth,
            {"model": settings.model_name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8})},
        "/v1/completions": {"post": _generation(
            "Create a completion", "CompletionRequest", "Completion", _openai_events("Completion"), auth,
            {"model": settings.model_name, "prompt": "Once upon a time", "max_tokens": 8, "stream": True})},
        "/v1/responses": {"post": _generation(
            "Create a model response (OpenAI's Responses API; nothing is stored)", "ResponsesRequest",
            "Response", _RESPONSE_EVENTS, auth,
            {"model": settings.model_name, "instructions": "Be brief.", "input": "hello", "max_output_tokens": 16})},
        "/v1/messages": {"post": _generation(
            "Create a message (Anthropic Messages API; x-api-key works like a bearer key)", "MessagesRequest",
            "Message", _NAMED_EVENTS, auth,
            {"model": settings.model_name, "max_tokens": 8, "messages": [{"role": "user", "content": "hello"}]},
            envelope="AnthropicErrorResponse")},
        "/v1/messages/count_tokens": {"post": _generation(
            "Count a message's prompt tokens (Anthropic Messages API)", "CountTokensRequest", "TokenCount", None,
            auth, {"model": settings.model_name, "messages": [{"role": "user", "content": "hello"}]},
            envelope="AnthropicErrorResponse")},
    }


def _model_paths(auth: bool) -> dict[str, Any]:
    return {
        "/v1/models": {"get": _get("List the served model", {"description": "the model list",
                                                             "content": _json("ModelList")}, _UNAVAILABLE, auth)},
        "/v1/models/{model_id}": {"get": {
            **_get("Describe the served model", {"description": "the model", "content": _json("Model")},
                   {"404": "model not found", **_UNAVAILABLE}, auth),
            "parameters": [{"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}],
        }},
    }


def _token_paths(settings: Settings, auth: bool) -> dict[str, Any]:
    """vLLM's token routes."""
    return {
        "/tokenize": {"post": _post(
            "Tokenize a prompt, or a chat as /v1/chat/completions renders it (vLLM's endpoint)",
            {"anyOf": [{"$ref": REF.format(name="TokenizeCompletionRequest")},
                       {"$ref": REF.format(name="TokenizeChatRequest")}]},
            "TokenizeResponse", _TOKEN_ERRORS, auth,
            {"model": settings.model_name, "messages": [{"role": "user", "content": "hello"}]})},
        "/detokenize": {"post": _post(
            "Turn token ids back into text (vLLM's endpoint)", {"$ref": REF.format(name="DetokenizeRequest")},
            "DetokenizeResponse", _TOKEN_ERRORS, auth, {"model": settings.model_name, "tokens": [1, 2, 3]})},
    }


def _helper_paths(auth: bool) -> dict[str, Any]:
    """The helper models' OpenAI and rerank routes."""
    rerank = _post("Rank documents by relevance to a query (Cohere, Jina and vLLM's shape; RERANK_MODEL)",
                   {"$ref": REF.format(name="RerankRequest")}, "RerankResponse", _HELPER_ERRORS, auth,
                   {"query": "capital of France", "documents": ["Paris is the capital of France", "bananas"]})
    return {
        "/v1/embeddings": {"post": _post(
            "Embed inputs with the embedding model beside the served one (EMBEDDING_MODEL)",
            {"$ref": REF.format(name="EmbeddingRequest")}, "EmbeddingList", _HELPER_ERRORS, auth,
            {"model": "default", "input": ["hello"]})},
        "/v1/rerank": {"post": rerank},
        "/rerank": {"post": rerank},
        "/v2/rerank": {"post": rerank},
    }


def _health_path() -> dict[str, Any]:
    """/health never needs a key; its 503 carries the same body as its 200."""
    health = {"get": _get("Engine and API health (never needs a key)", {
        "description": "the engine answers and makes progress", "content": _json("Health")},
        {"503": "the engine is unreachable or stalled"})}
    health["get"]["responses"]["503"]["content"] = _json("Health")
    return health


def _annotate(doc: dict[str, Any], auth: bool) -> None:
    """Every response names its request (x-request-id); with a key, /v1, /api and the token routes need a
    bearer token."""
    for item in doc["paths"].values():
        for operation in item.values():
            for response in operation["responses"].values():
                response["headers"] = {**response.get("headers", {}), **_REQUEST_ID}
    if auth:
        doc["components"]["securitySchemes"] = {"bearerAuth": {"type": "http", "scheme": "bearer"}}
        for path, item in doc["paths"].items():
            if path.startswith(("/v1/", "/v2/", "/api/")) or path in ("/tokenize", "/detokenize", "/rerank"):
                for operation in item.values():
                    operation["security"] = [{"bearerAuth": []}]


def openapi_route(served: Served) -> Route:
    """GET /openapi.json, open like /health (it holds no secret); its examples name the model served now."""
    bodies: dict[str, bytes] = {}

    async def endpoint(request: Request) -> Response:
        settings = await served.fresh()
        if (body := bodies.get(settings.model_name)) is None:
            bodies.clear()  # one served model at a time: the previous document is not asked for again
            body = bodies[settings.model_name] = msgspec.json.encode(openapi_document(settings))
        return Response(body, media_type="application/json")

    return Route("/openapi.json", endpoint, methods=["GET"])
