"""The embeddings and rerank endpoints (OpenAI /v1/embeddings, Ollama /api/embed and /api/embeddings, /v1/rerank and
its aliases) against a fake engine on the real wire: their shapes, every bad input a 4xx in the dialect's own error
shape, and the helpers listed by /v1/models, /api/tags and /api/show."""

from __future__ import annotations

import base64
import json
import struct

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ipc
from tests.unit.openai_errors import assert_error as openai_error

pytestmark = pytest.mark.anyio

EMBEDDER = ipc.HelperState(kind="embedding", name="zoo-qwen3-embedding", family="decoder_embed", max_tokens=512,
                           dimensions=8, matryoshka=True, weight_bytes=1000)
RERANKER = ipc.HelperState(kind="rerank", name="tiny-reranker", family="rerank", max_tokens=512, weight_bytes=2000)


@pytest.fixture
def helpers(engine):
    engine.info = msgspec.structs.replace(engine.info, helpers=[EMBEDDER, RERANKER])
    return engine


def assert_error(r, status: int, *words: str, param: str | None = None, code: str | None = None) -> dict:
    error = openai_error(r, status, param=param, code=code)
    assert all(w in error["message"] for w in words), error
    return error


def unit(i: int, width: int = 8) -> list[float]:
    return [float(j == i % width) for j in range(width)]


# ---------------------------------------------------------------- no helper configured


@pytest.mark.parametrize(("path", "body", "setting"), [
    ("/v1/embeddings", {"model": "x", "input": "hi"}, "EMBEDDING_MODEL"),
    ("/v1/rerank", {"query": "q", "documents": ["a"]}, "RERANK_MODEL"),
    ("/rerank", {"query": "q", "documents": ["a"]}, "RERANK_MODEL"),
])
async def test_without_a_helper_the_endpoint_is_a_404_naming_its_setting(engine, client, path, body, setting):
    error = assert_error(await client.post(path, json=body), 404, setting, param="model", code="model_not_found")
    assert "docs/helpers.md" in error["message"]
    assert engine.helper_requests == []


@pytest.mark.parametrize("path", ["/api/embed", "/api/embeddings"])
async def test_without_an_embedder_ollama_gets_a_404_in_its_shape(engine, client, path):
    r = await client.post(path, json={"model": "x", "input": "hi", "prompt": "hi"})
    assert r.status_code == 404
    assert set(r.json()) == {"error"} and "EMBEDDING_MODEL" in r.json()["error"]


# ---------------------------------------------------------------- OpenAI /v1/embeddings


@pytest.mark.parametrize(("given_input", "sent"), [
    ("hello", ["hello"]),
    (["a", "b c"], ["a", "b c"]),
    ([5, 6, 7], [[5, 6, 7]]),
    ([[5, 6], [7]], [[5, 6], [7]]),
    (["a", [1, 2]], ["a", [1, 2]]),
])
async def test_every_input_form_reaches_the_engine_as_inputs(helpers, client, given_input, sent):
    r = await client.post("/v1/embeddings", json={"model": "default", "input": given_input})
    assert r.status_code == 200, r.text
    assert helpers.helper_requests[0].inputs == sent
    body = r.json()
    assert body["object"] == "list" and body["model"] == EMBEDDER.name
    assert [d["index"] for d in body["data"]] == list(range(len(sent)))
    assert [d["embedding"] for d in body["data"]] == [unit(i) for i in range(len(sent))]
    assert body["usage"] == {"prompt_tokens": 3 * len(sent), "total_tokens": 3 * len(sent)}


async def test_base64_is_the_float32_bytes_of_the_same_embedding(helpers, client):
    r = await client.post("/v1/embeddings", json={"model": EMBEDDER.name, "input": ["a", "b"],
                                                  "encoding_format": "base64"})
    assert r.status_code == 200, r.text
    decoded = [list(struct.unpack("<8f", base64.b64decode(d["embedding"]))) for d in r.json()["data"]]
    assert decoded == [unit(0), unit(1)]


async def test_dimensions_reach_the_engine_for_a_matryoshka_model(helpers, client):
    r = await client.post("/v1/embeddings", json={"model": "default", "input": "a", "dimensions": 4})
    assert r.status_code == 200, r.text
    assert helpers.helper_requests[0].dimensions == 4 and len(r.json()["data"][0]["embedding"]) == 4
    assert helpers.helper_requests[0].truncate is False  # OpenAI has no truncation: too long is a 400


@pytest.mark.parametrize(("helper", "dimensions", "words"), [
    (msgspec.structs.replace(EMBEDDER, matryoshka=False), 4, "Matryoshka"),
    (EMBEDDER, 9, "exceeds"),
])
async def test_dimensions_the_model_cannot_give_are_400(engine, client, helper, dimensions, words):
    engine.info = msgspec.structs.replace(engine.info, helpers=[helper])
    r = await client.post("/v1/embeddings", json={"model": "default", "input": "a", "dimensions": dimensions})
    assert_error(r, 400, words, param="dimensions")
    assert engine.helper_requests == []


@pytest.mark.parametrize(("body", "param"), [
    ({"input": []}, "input"),
    ({"input": ""}, "input"),
    ({"input": ["a", ""]}, "input[1]"),
    ({"input": ["a", 3]}, "input[1]"),
    ({"input": [[1], []]}, "input[1]"),
    ({"input": [[1], [-1]]}, "input[1]"),
    ({"input": [True]}, "input[0]"),
    ({"input": {"text": "a"}}, "input"),
    ({"input": None}, "input"),
    ({"input": ["a"] * 2049}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "model": "gpt-4o"}, "model"),
    ({"model": "default"}, "input"),
])
async def test_bad_embedding_requests_are_4xx_naming_the_field(helpers, client, body, param):
    r = await client.post("/v1/embeddings", json={"model": "default", **body})
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text
    assert helpers.helper_requests == []


async def test_the_engines_refusal_of_a_long_input_names_it(helpers, client):
    helpers.helper_answer = lambda msg: [ipc.Error(status=400, message="'input[1]' is 600 tokens long, more than "
                                                   "zoo-qwen3-embedding's limit of 512; shorten it", param="input[1]",
                                                   code="context_length_exceeded", request_id=msg.request_id)]
    r = await client.post("/v1/embeddings", json={"model": "default", "input": ["a", "b " * 600]})
    assert_error(r, 400, "shorten it", param="input[1]", code="context_length_exceeded")


# ---------------------------------------------------------------- Ollama /api/embed, /api/embeddings


async def test_ollama_embed_shape_truncate_and_dimensions(helpers, client):
    r = await client.post("/api/embed", json={"model": EMBEDDER.name, "input": ["a", "b"]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == EMBEDDER.name and body["embeddings"] == [unit(0), unit(1)]
    assert body["prompt_eval_count"] == 6 and body["total_duration"] > 0
    assert helpers.helper_requests[0].truncate is True  # Ollama's default: cut to the context
    await client.post("/api/embed", json={"model": EMBEDDER.name + ":latest", "input": "a", "truncate": False,
                                          "dimensions": 4})
    assert (helpers.helper_requests[1].truncate, helpers.helper_requests[1].dimensions) == (False, 4)


async def test_ollama_empty_input_loads_and_answers_no_embeddings(helpers, client):
    for empty in ("", []):
        r = await client.post("/api/embed", json={"model": EMBEDDER.name, "input": empty})
        assert r.status_code == 200 and r.json()["embeddings"] == []
    r = await client.post("/api/embeddings", json={"model": EMBEDDER.name, "prompt": ""})
    assert r.status_code == 200 and r.json() == {"embedding": []}
    assert helpers.helper_requests == []


async def test_ollama_legacy_embeddings(helpers, client):
    r = await client.post("/api/embeddings", json={"model": EMBEDDER.name, "prompt": "hello"})
    assert r.status_code == 200 and r.json() == {"embedding": unit(0)}
    assert helpers.helper_requests[0].inputs == ["hello"] and helpers.helper_requests[0].truncate


@pytest.mark.parametrize("body", [
    {"input": ["a", ""]}, {"input": [1, 2]}, {"input": 5}, {"input": "a", "dimensions": 9},
    {"input": "a", "model": "other"}, {"input": ["a"] * 2049}, {"input": "a", "truncate": "yes"},
])
async def test_bad_ollama_embed_requests_are_4xx_in_its_shape(helpers, client, body):
    r = await client.post("/api/embed", json={"model": EMBEDDER.name, **body})
    assert 400 <= r.status_code < 500 and set(r.json()) == {"error"}, r.text
    assert helpers.helper_requests == []


# ---------------------------------------------------------------- /v1/rerank


@pytest.mark.parametrize("path", ["/v1/rerank", "/rerank", "/v2/rerank"])
async def test_rerank_sorts_by_relevance_with_top_n_and_documents(helpers, client, path):
    # the fake scores document i 1/(1+i): the order sent is the order of relevance, reversed here
    r = await client.post(path, json={"model": RERANKER.name, "query": "q", "documents": ["a", {"text": "b"}, "c"],
                                      "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert helpers.helper_requests[0].documents == ["a", "b", "c"]
    assert body["model"] == RERANKER.name and body["usage"] == {"total_tokens": 30}
    assert body["results"] == [{"index": 0, "relevance_score": 1.0, "document": {"text": "a"}},
                               {"index": 1, "relevance_score": 0.5, "document": {"text": "b"}}]


async def test_cohere_clients_v1_and_v2_read_our_rerank_answers(helpers, make_settings):
    """Cohere's own SDK (as vLLM's rerank example drives it): v1 posts /v1/rerank, v2 posts /v2/rerank."""
    cohere = pytest.importorskip("cohere")
    import httpx

    from api import create_app

    transport = httpx.ASGITransport(app=create_app(make_settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        v1 = await cohere.AsyncClient(base_url="http://test", api_key="x", httpx_client=http).rerank(
            model=RERANKER.name, query="q", documents=["a", "b", "c"], top_n=2, return_documents=True)
        v2 = await cohere.AsyncClientV2(base_url="http://test", api_key="x", httpx_client=http).rerank(
            model=RERANKER.name, query="q", documents=["a", "b"], top_n=1)
    assert [(r.index, r.relevance_score, r.document.text) for r in v1.results] == [(0, 1.0, "a"), (1, 0.5, "b")]
    assert [(r.index, r.relevance_score) for r in v2.results] == [(0, 1.0)]


async def test_rerank_without_return_documents_gives_indices_and_scores(helpers, client):
    r = await client.post("/v1/rerank", json={"query": "q", "documents": ["a", "b"]})
    assert r.json()["results"] == [{"index": 0, "relevance_score": 1.0}, {"index": 1, "relevance_score": 0.5}]


@pytest.mark.parametrize(("fields", "truncate", "per_doc"), [
    ({}, True, 0),  # Cohere, Jina and vLLM cut a long document by default
    ({"truncate": "END", "max_tokens_per_doc": 64}, True, 64),
    ({"truncate": "none"}, False, 0),
    ({"truncate": False}, False, 0),  # TEI's boolean
    ({"truncate": True}, True, 0),
    ({"truncate_prompt_tokens": -1}, True, 0),  # vLLM's "cut to the model's limit"
])
async def test_rerank_truncation_fields_reach_the_engine(helpers, client, fields, truncate, per_doc):
    r = await client.post("/v1/rerank", json={"query": "q", "documents": ["a"], **fields})
    assert r.status_code == 200, r.text
    sent = helpers.helper_requests[0]
    assert (sent.truncate, sent.max_tokens_per_doc) == (truncate, per_doc)


async def test_cohere_v2s_max_tokens_per_doc_reaches_the_engine(helpers, make_settings):
    cohere = pytest.importorskip("cohere")
    import httpx

    from api import create_app

    transport = httpx.ASGITransport(app=create_app(make_settings()))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        await cohere.AsyncClientV2(base_url="http://test", api_key="x", httpx_client=http).rerank(
            model=RERANKER.name, query="q", documents=["a"], max_tokens_per_doc=32)
    assert helpers.helper_requests[0].max_tokens_per_doc == 32 and helpers.helper_requests[0].truncate


@pytest.mark.parametrize(("body", "param"), [
    ({"query": "q", "documents": []}, "documents"),
    ({"query": "", "documents": ["a"]}, "query"),
    ({"query": "q", "documents": [3]}, "documents[0]"),
    ({"query": "q", "documents": [{"txt": "a"}]}, "documents[0].text"),
    ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
    ({"query": "q", "documents": ["a"], "model": "other"}, "model"),
    ({"documents": ["a"]}, "query"),
    ({"query": "q", "documents": ["a"] * 2049}, "documents"),
    ({"query": "q", "documents": ["a"], "truncate": "START"}, "truncate"),
    ({"query": "q", "documents": ["a"], "truncate": 3}, "truncate"),
    ({"query": "q", "documents": ["a"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
    ({"query": "q", "documents": ["a"], "truncate_prompt_tokens": 64}, "truncate_prompt_tokens"),
])
async def test_bad_rerank_requests_are_4xx_naming_the_field(helpers, client, body, param):
    r = await client.post("/v1/rerank", json=body)
    assert 400 <= r.status_code < 500 and r.json()["error"]["param"] == param, r.text
    assert helpers.helper_requests == []


# ---------------------------------------------------------------- listings


async def test_models_tags_and_show_list_the_helpers_with_their_kind(helpers, client):
    data = (await client.get("/v1/models")).json()["data"]
    assert [(m["id"], m.get("kind")) for m in data] == [("test-model", None), (EMBEDDER.name, "embedding"),
                                                          (RERANKER.name, "rerank")]
    assert (await client.get(f"/v1/models/{EMBEDDER.name}")).json()["kind"] == "embedding"
    tags = (await client.get("/api/tags")).json()["models"]
    assert [m["name"] for m in tags] == ["test-model", EMBEDDER.name, RERANKER.name]
    show = (await client.post("/api/show", json={"model": EMBEDDER.name})).json()
    assert show["capabilities"] == ["embedding"]
    assert show["model_info"]["decoder_embed.embedding_length"] == 8


# ---------------------------------------------------------------- property: never a 5xx

SAFE = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False),
                    st.text(max_size=8))
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                            max_size=3), max_leaves=10)
GOOD = {
    "/v1/embeddings": {"model": "default", "input": ["a"]},
    "/api/embed": {"model": EMBEDDER.name, "input": ["a"]},
    "/api/embeddings": {"model": EMBEDDER.name, "prompt": "a"},
    "/v1/rerank": {"query": "q", "documents": ["a"]},
}
FIELDS = ["model", "input", "prompt", "encoding_format", "dimensions", "truncate", "query", "documents", "top_n",
          "return_documents", "options"]
mutated = st.tuples(st.sampled_from(sorted(GOOD)), st.dictionaries(st.sampled_from(FIELDS), values, min_size=1,
                                                                    max_size=3))


@SAFE
@given(mutated)
async def test_any_helper_body_gets_a_2xx_or_a_4xx_in_its_dialects_shape(helpers, client, case):
    path, extra = case
    with anyio.fail_after(10):
        r = await client.post(path, content=json.dumps({**GOOD[path], **extra}).encode(),
                              headers={"Content-Type": "application/json"})
    assert r.status_code < 500, r.text
    if r.status_code >= 400:
        body = r.json()
        if path.startswith("/api/"):
            assert set(body) == {"error"} and body["error"]
        else:
            assert set(body["error"]) == {"message", "type", "param", "code"}
