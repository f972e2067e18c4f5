"""Embeddings from the helper model beside the served one, against the real engine: the openai SDK's
embeddings.create, the ollama SDK's embed and LangChain's OpenAIEmbeddings get what an in-process reference computes
the Qwen3-Embedding way (mlx-lm's qwen3 model alone, one input at a time, no batching: the final hidden state of the
last token after <|endoftext|>, L2-normalized), while a chat generation runs beside them. One stack for the module."""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pytest

from tests import qwen3_embedding
from tests.harness import serving
from tests.qwen3_embedding import cosines

EMBEDDER = "zoo-qwen3-embedding"
TEXTS = ["hello world", "The cat sat on the mat, and then it slept for a long time.", "x",
         "Embeddings beside a big model " * 6]


@pytest.fixture(scope="module")
def stack():
    with serving("demo-tiny", EMBEDDING_MODEL=EMBEDDER) as (s, client):
        yield s, client


@pytest.fixture(scope="module")
def reference(stack):
    """texts -> [n, 64] embeddings computed in this process from the model folder the engine loaded."""
    s, _ = stack
    return qwen3_embedding.reference(next(h["path"] for h in httpx.get(s.base_url + "/health").json()["helpers"]))


def test_the_sdks_get_the_reference_embeddings_while_a_chat_runs(stack, reference):
    import ollama
    from langchain_openai import OpenAIEmbeddings

    s, client = stack
    want, tokens = reference(TEXTS)
    chat: dict = {}
    # a generation decodes meanwhile: helper work slots in between its steps and neither waits for the other's end
    runner = threading.Thread(target=lambda: chat.setdefault("reply", client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "hi"}], max_tokens=40, temperature=0)))
    runner.start()
    got = client.embeddings.create(model=EMBEDDER, input=TEXTS * 16)  # the SDK asks for base64 and decodes it
    runner.join(60)
    assert chat["reply"].usage.completion_tokens == 40
    assert len(got.data) == 4 * 16 and [d.index for d in got.data] == list(range(64))
    assert cosines([d.embedding for d in got.data], np.tile(want, (16, 1))).min() >= 0.9999
    assert got.usage.prompt_tokens == 16 * tokens and got.model == EMBEDDER

    floats = httpx.post(s.base_url + "/v1/embeddings", json={"model": EMBEDDER, "input": TEXTS[:2],
                                                             "encoding_format": "float"}).json()
    assert cosines([d["embedding"] for d in floats["data"]], want[:2]).min() >= 0.9999

    short = client.embeddings.create(model=EMBEDDER, input=TEXTS[1], dimensions=16).data[0].embedding
    assert len(short) == 16
    assert cosines([short], [want[1, :16]])[0] >= 0.9999 and abs(np.linalg.norm(short) - 1) < 1e-5

    with ollama.Client(host=s.base_url, timeout=60) as llama:
        answer = llama.embed(model=EMBEDDER, input=TEXTS)
    assert cosines(answer.embeddings, want).min() >= 0.9999 and answer.prompt_eval_count == tokens

    lc = OpenAIEmbeddings(model=EMBEDDER, base_url=s.base_url + "/v1", api_key="unused", max_retries=0,
                          check_embedding_ctx_length=False)  # its default tokenizes with tiktoken, OpenAI's models only
    assert cosines(lc.embed_documents(TEXTS), want).min() >= 0.9999


def test_too_long_is_a_400_for_openai_and_cut_to_the_context_for_ollama(stack, reference):
    import openai

    s, client = stack
    long_text = "word " * 700  # past the zoo embedder's 512 tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model=EMBEDDER, input=["fine", long_text])
    assert refused.value.body["param"] == "input[1]" and "512" in refused.value.body["message"]
    cut = httpx.post(s.base_url + "/api/embed", json={"model": EMBEDDER, "input": long_text}, timeout=60)
    assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == 512
    kept = httpx.post(s.base_url + "/api/embed", json={"model": EMBEDDER, "input": long_text, "truncate": False})
    assert kept.status_code == 400 and "512" in kept.json()["error"]


def test_the_helper_is_listed_and_counted_in_rank_0s_memory(stack):
    s, client = stack
    assert [(m.id, getattr(m, "kind", None)) for m in client.models.list().data] == [
        ("demo-tiny", None), (EMBEDDER, "embedding")]
    health = httpx.get(s.base_url + "/health").json()
    (helper,) = health["helpers"]
    assert helper["kind"] == "embedding" and helper["dimensions"] == 64 and helper["weight_bytes"] > 0
    assert health["rank_states"][0]["helper_bytes"] == helper["weight_bytes"]
    assert health["helper_work"]["inputs"] >= 64
    metrics = httpx.get(s.base_url + "/metrics").text
    weights = f'helper_weight_bytes{{kind="embedding",name="{EMBEDDER}",rank="0"}}'
    assert f"{weights} {float(helper['weight_bytes'])}" in metrics
    assert httpx.post(s.base_url + "/v1/rerank", json={"query": "q", "documents": ["a"]}).status_code == 404
