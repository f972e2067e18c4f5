"""Rerank request -> the engine's Rerank, and its scores -> results sorted by relevance."""

from __future__ import annotations

import uuid

from msgspec import UNSET

import ipc
from api.errors import InvalidRequest
from api.helpers import check_count, check_helper_model
from api.rerank.protocol import RerankRequest, RerankResponse, RerankResult, RerankUsage, TextDocument


def new_request_id() -> str:
    return f"rerank-{uuid.uuid4().hex}"


def texts(req: RerankRequest) -> list[str]:
    return [d if isinstance(d, str) else d.text for d in req.documents]


def rerank_request(req: RerankRequest, request_id: str, helper: ipc.HelperState, max_inputs: int) -> ipc.Rerank:
    check_helper_model(req.model, helper)
    check_count(len(req.documents), max_inputs, "documents", "document")
    if not req.query:
        raise InvalidRequest("Invalid value for 'query': an empty string; send the text to rank the documents by.",
                             param="query")
    return ipc.Rerank(request_id=request_id, query=req.query, documents=texts(req), truncate=truncates(req),
                      max_tokens_per_doc=req.max_tokens_per_doc or 0)


def truncates(req: RerankRequest) -> bool:
    """Whether a document too long for the model is cut to fit (the default) or refused."""
    if req.truncate_prompt_tokens not in (None, -1):
        raise InvalidRequest("Invalid value for 'truncate_prompt_tokens': only -1 (cut to the model's limit, what this "
                             "server does by default) is taken; send max_tokens_per_doc to cut documents shorter.",
                             param="truncate_prompt_tokens")
    value = req.truncate
    if value is UNSET or isinstance(value, bool):
        return value is not False
    if value.upper() in ("END", "NONE"):
        return value.upper() == "END"
    raise InvalidRequest(f"Invalid value for 'truncate': {value!r}; send \"END\" (cut a long document's end to fit, "
                         "the default) or \"NONE\" (refuse it), or true or false.", param="truncate")


def rerank_response(req: RerankRequest, reply: ipc.Reranked, model: str) -> RerankResponse:
    """Results by relevance, highest first (ties keep the documents' order), top_n of them when asked."""
    docs = texts(req)
    order = sorted(range(len(reply.scores)), key=lambda i: -reply.scores[i])
    if req.top_n is not UNSET and req.top_n:
        order = order[:req.top_n]
    results = [RerankResult(index=i, relevance_score=reply.scores[i],
                            document=TextDocument(text=docs[i]) if req.return_documents else None) for i in order]
    return RerankResponse(id=reply.request_id, model=model, usage=RerankUsage(total_tokens=reply.prompt_tokens),
                          results=results)
