"""HELPER_RANK=1 on two ranks spawned by mlx.launch: the embedder loads on rank 1 alone (its memory in rank 1's
report, not rank 0's; its listener on HELPER_PORT), rank 0 forwards /v1/embeddings there and gets what an
in-process reference computes, and a chat stream keeps receiving tokens while a large embedding request runs."""

from __future__ import annotations

import socket
import threading

import httpx
import numpy as np
import openai
import pytest

from tests import qwen3_embedding
from ops.procs import free_port
from tests.harness import Stack

pytestmark = pytest.mark.multirank

EMBEDDER = "zoo-qwen3-embedding"
TEXTS = ["hello world", "The cat sat on the mat, and then it slept for a long time.", "x",
         "Embeddings beside a big model " * 6]


def test_helpers_on_rank_1_are_served_through_rank_0_and_chat_keeps_streaming():
    s = Stack()
    port = free_port()  # a fixed HELPER_PORT, as hosts that filter by port set it
    procs = [s.start_engine(ranks=2, EMBEDDING_MODEL=EMBEDDER, HELPER_RANK="1", HELPER_PORT=str(port))]
    client = openai.OpenAI(base_url=s.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
    try:
        procs.append(s.start_api())
        health = httpx.get(s.base_url + "/health").json()
        (helper,) = health["helpers"]
        assert helper["rank"] == 1 and helper["weight_bytes"] > 0
        r0, r1 = health["rank_states"]
        assert (r0["helper_bytes"], r1["helper_bytes"]) == (0, helper["weight_bytes"])
        # both ranks hold the same half of the served model: rank 1's MLX memory holds the helper's weights on top
        assert r1["active_memory"] - r0["active_memory"] >= 0.9 * helper["weight_bytes"]
        socket.create_connection(("127.0.0.1", port), timeout=5).close()  # rank 1 listens where it was told

        want, tokens = qwen3_embedding.reference(helper["path"])(TEXTS)
        got = client.embeddings.create(model=EMBEDDER, input=TEXTS)
        assert qwen3_embedding.cosines([d.embedding for d in got.data], want).min() >= 0.9999
        assert got.usage.prompt_tokens == tokens

        # a large request's slices run on rank 1 between the steps of a chat stream that keeps decoding
        big: dict = {}
        stream = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=200, temperature=0, stream=True)
        chunks = iter(stream)
        next(chunks)
        runner = threading.Thread(target=lambda: big.setdefault("reply", client.embeddings.create(
            model=EMBEDDER, input=TEXTS * 64)))
        runner.start()
        during = after = 0
        for chunk in chunks:
            if chunk.choices and chunk.choices[0].delta.content is not None:
                if runner.is_alive():
                    during += 1
                else:
                    after += 1
        runner.join(120)
        assert len(big["reply"].data) == 4 * 64
        assert qwen3_embedding.cosines([d.embedding for d in big["reply"].data[:4]], want).min() >= 0.9999
        assert during > 0, (during, after)  # tokens arrived while rank 1 embedded 256 inputs
        assert client.chat.completions.create(model="default", messages=[{"role": "user", "content": "hi"}],
                                              max_tokens=4).usage.completion_tokens == 4
    finally:
        client.close()
        for p in reversed(procs):
            p.stop()
