"""Rerank bodies as Cohere, Jina and vLLM's clients send and read them."""

from __future__ import annotations

from typing import Annotated

from msgspec import UNSET, Meta, Struct, UnsetType


class TextDocument(Struct, kw_only=True):
    text: str


class RerankRequest(Struct, kw_only=True):
    query: str
    documents: list[str | TextDocument]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=0)] | UnsetType = UNSET  # 0 or absent: every document
    return_documents: bool = False
    max_tokens_per_doc: Annotated[int, Meta(ge=1)] | UnsetType = UNSET  # Cohere v2: cut each document to this many
    # non-Cohere extensions
    # "END" or true (the default, as Cohere, Jina and vLLM cut): a document too long for the model is cut at its end;
    # "NONE" or false (TEI's default): it is refused with a 400 naming it
    truncate: bool | str | UnsetType = UNSET
    truncate_prompt_tokens: int | None = None  # vLLM's: -1 (cut to the model's limit, as here by default) or null


class RerankResult(Struct, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: TextDocument | None = None


class RerankUsage(Struct, kw_only=True):
    total_tokens: int


class RerankResponse(Struct, kw_only=True):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
