"""The encoder and reranker families served by the real engine: /v1/embeddings from a BERT encoder and /v1/rerank
from a Qwen3-Reranker give what the same family computes in this process on the folder the engine loaded, read
through the official clients (openai, cohere). One stack for the module."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.harness import serving

EMBEDDER, RERANKER = "zoo-bert-embedding", "zoo-qwen3-reranker"
QUERY = "Where does the cat sleep?"
DOCUMENTS = ["The cat sleeps on the mat.", "Stocks fell on Tuesday.", "A dog barks at night.", "cat mat sleep"]


@pytest.fixture(scope="module")
def stack():
    with serving("demo-tiny", EMBEDDING_MODEL=EMBEDDER, RERANK_MODEL=RERANKER) as (s, client):
        yield s, client


def _local(s, kind: str):
    """The family's own load of the folder the engine loaded, in this process."""
    from engine.helpers.families import encoder, rerank

    helper = next(h for h in httpx.get(s.base_url + "/health", timeout=10).json()["helpers"] if h["kind"] == kind)
    family = encoder if kind == "embedding" else rerank
    return family.load(Path(helper["path"]), helper["name"])


def test_rerank_scores_are_the_families_own_sorted_and_cut_to_top_n(stack):
    s, _ = stack
    local = _local(s, "rerank")
    want = np.array(local.score([local.pair_tokens(QUERY, d) for d in DOCUMENTS]))
    r = httpx.post(s.base_url + "/v1/rerank", timeout=60, json={
        "model": RERANKER, "query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    order = [int(i) for i in np.argsort(-want, kind="stable")[:3]]
    assert [x["index"] for x in results] == order
    assert [x["relevance_score"] for x in results] == pytest.approx([float(want[i]) for i in order], abs=1e-5)
    assert [x["document"]["text"] for x in results] == [DOCUMENTS[i] for i in order]
    assert r.json()["usage"]["total_tokens"] > 0


def test_the_cohere_client_reads_the_served_rerank(stack):
    import cohere
    s, _ = stack
    with httpx.Client(timeout=60) as http:
        client = cohere.ClientV2(base_url=s.base_url, api_key="x", httpx_client=http)
        answer = client.rerank(model=RERANKER, query=QUERY, documents=DOCUMENTS, top_n=2)
    assert len(answer.results) == 2 and answer.results[0].relevance_score >= answer.results[1].relevance_score


def test_bert_embeddings_are_the_encoders_own_and_both_helpers_are_listed(stack):
    s, client = stack
    local = _local(s, "embedding")
    want = np.array(local.embed([local.tokenize(t) for t in DOCUMENTS]), dtype=np.float64)
    got = np.array([d.embedding for d in client.embeddings.create(model=EMBEDDER, input=DOCUMENTS).data])
    cos = (want * got).sum(1) / np.linalg.norm(want, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() >= 0.9999, cos
    kinds = {m.id: getattr(m, "kind", None) for m in client.models.list().data}
    assert kinds == {"demo-tiny": None, EMBEDDER: "embedding", RERANKER: "rerank"}



def test_long_documents_are_cut_per_cohere_v2_or_refused_by_index_with_truncate_none(stack):
    import cohere
    s, _ = stack
    local = _local(s, "rerank")
    # past the reranker's 8,192 tokens; only tokenized here (scoring that much on a CPU takes gigabytes)
    long_doc = "The cat sleeps on the mat. " * (local.max_tokens // 5)
    full = local.pair_tokens(QUERY, long_doc)
    assert len(full) > local.max_tokens
    with httpx.Client(timeout=60) as http:  # Cohere v2's own cap per document
        answer = cohere.ClientV2(base_url=s.base_url, api_key="x", httpx_client=http).rerank(
            model=RERANKER, query=QUERY, documents=[DOCUMENTS[1], long_doc], max_tokens_per_doc=16)
    # the card's prompt with the document's tail dropped, its closing tokens kept: 16 tokens of the document
    fixed = len(local.pair_tokens(QUERY, "x")) - 1  # the prompt and the query around a one-token document
    cut = full[:fixed + 16 - len(local.suffix)] + local.suffix
    short = local.pair_tokens(QUERY, DOCUMENTS[1])
    want = [float(x) for x in local.score([short, cut])]
    got = {x.index: x.relevance_score for x in answer.results}
    assert [got[0], got[1]] == pytest.approx(want, abs=1e-5)
    raw = httpx.post(s.base_url + "/v1/rerank", timeout=60,
                     json={"query": QUERY, "documents": [DOCUMENTS[1], long_doc], "max_tokens_per_doc": 16})
    assert raw.json()["usage"]["total_tokens"] == len(short) + len(cut)  # what was scored, not what was sent

    refused = httpx.post(s.base_url + "/v1/rerank", timeout=60,
                         json={"query": QUERY, "documents": [DOCUMENTS[1], long_doc], "truncate": "NONE"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "documents[1]", refused.text
    too_long = httpx.post(s.base_url + "/v1/rerank", timeout=60, json={"query": long_doc, "documents": ["a"]})
    assert too_long.status_code == 400 and too_long.json()["error"]["param"] == "query", too_long.text
