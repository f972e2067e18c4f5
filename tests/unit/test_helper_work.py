"""Rank 0's helper work without MLX: the slices between steps stay within HELPER_TOKENS_PER_STEP (padding counted),
answers come back in input order, a client that left takes its queued work with it, and the engine's checks of an
Embed (too long, truncated, token ids, matryoshka) answer in one sentence naming the input."""

from __future__ import annotations

import queue

import numpy as np
import pytest

from engine.helpers.work import HelperWork, Job
from engine.rank0.errors import Refused
from engine.rank0.helper_desk import HelperDesk
from ipc import Embed, Rerank


class FakeEmbedder:
    """Embeds an input as its length and first token; tokenizes a text as its words' lengths, then an EOS (9)."""

    kind, name, max_tokens, dimensions, matryoshka, vocab_size = "embedding", "fake", 8, 4, True, 100

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []

    def tokenize(self, text: str) -> list[int]:
        return [len(w) for w in text.split()] + [9]

    def embed(self, batch: list[list[int]]) -> np.ndarray:
        self.batches.append(batch)
        return np.array([[len(ids), ids[0], 0, 0] for ids in batch], dtype=np.float32)

    def pair_tokens(self, query: str, document: str) -> list[int]:
        return self.tokenize(query + " " + document)

    def score(self, batch: list[list[int]]) -> np.ndarray:
        return np.array([1 / len(ids) for ids in batch], dtype=np.float32)


def run(work: HelperWork) -> list[int]:
    costs = []
    while work.pending():
        costs.append(work.run_slice())
    return costs


def test_slices_stay_within_the_budget_padding_included_and_results_keep_input_order():
    helper, results = FakeEmbedder(), []
    lengths = [5, 1, 7, 2, 2, 3, 40, 1]
    inputs = [[i + 1] * n for i, n in enumerate(lengths)]
    work = HelperWork(budget=8)
    work.add(Job(helper, inputs, results.append))
    costs = run(work)
    for batch, cost in zip(helper.batches, costs):
        assert cost == len(batch) * max(map(len, batch))
        assert cost <= 8 or len(batch) == 1  # an input longer than the budget runs alone
    assert sorted(len(ids) for b in helper.batches for ids in b) == sorted(lengths)
    (out,) = results
    assert out[:, 0].tolist() == lengths and out[:, 1].tolist() == [i + 1 for i in range(len(lengths))]
    assert work.stats.inputs == len(lengths) and work.stats.tokens == sum(costs)


def test_a_cancelled_job_is_dropped_before_its_next_slice_and_the_next_job_runs():
    helper, first, second = FakeEmbedder(), [], []
    work = HelperWork(budget=2)
    gone = Job(helper, [[1, 1]] * 5, first.append)
    work.add(gone)
    work.add(Job(helper, [[2]], second.append))
    work.run_slice()
    gone.cancelled.set()
    run(work)
    assert first == [] and len(second) == 1
    assert len(helper.batches) == 2  # one slice of the cancelled job, then the other job


def test_a_helper_that_raises_fails_its_request_only():
    class Broken(FakeEmbedder):
        def embed(self, batch):
            raise RuntimeError("boom")

    failed, ok = [], []
    work = HelperWork(budget=64)
    work.add(Job(Broken(), [[1]], failed.append))
    work.add(Job(FakeEmbedder(), [[1]], ok.append))
    run(work)
    assert isinstance(failed[0], RuntimeError) and ok[0].shape == (1, 4)


def tokens(msg, helper=None):
    desk = HelperDesk({}, queue.SimpleQueue(), max_inputs=3, timeout=1)
    return desk._tokens(msg, helper or FakeEmbedder())


def test_truncation_cuts_text_to_the_limit_keeping_its_last_special_token_and_ids_plainly():
    long_text = " ".join(["ab"] * 20)
    cut = tokens(Embed(request_id="r", inputs=[long_text, list(range(1, 21))], truncate=True))
    assert cut == [[2] * 7 + [9], list(range(1, 9))]


@pytest.mark.parametrize(("msg", "param", "words"), [
    (Embed(request_id="r", inputs=["ok", " ".join(["ab"] * 20)]), "input[1]", "21 tokens long"),
    (Embed(request_id="r", inputs=[""]), "input[0]", "empty string"),
    (Embed(request_id="r", inputs=[[]]), "input[0]", "empty list"),
    (Embed(request_id="r", inputs=[[1, 100]]), "input[0]", "token id 100"),
    (Embed(request_id="r", inputs=[]), "input", "empty"),
    (Embed(request_id="r", inputs=["a"] * 4), "input", "HELPER_MAX_INPUTS"),
    (Embed(request_id="r", inputs=["a"], dimensions=5), "dimensions", "from 1 to 4"),
    (Embed(request_id="r", inputs=["a"], param="prompt"), None, None),
    (Rerank(request_id="r", query="", documents=["a"]), "query", "empty string"),
    (Rerank(request_id="r", query="q", documents=["a", " ".join(["ab"] * 8)]), "documents[1]", "with the query"),
])
def test_the_engine_refuses_what_the_helper_cannot_take_naming_the_input(msg, param, words):
    if param is None:
        assert tokens(msg) == [[1, 9]]
        return
    with pytest.raises(Refused) as refused:
        tokens(msg)
    assert refused.value.error.param == param and words in refused.value.error.message
    assert refused.value.error.status == 400


def test_dimensions_are_refused_for_a_model_that_is_not_matryoshka():
    helper = FakeEmbedder()
    helper.matryoshka = False
    with pytest.raises(Refused, match="matryoshka"):
        tokens(Embed(request_id="r", inputs=["a"], dimensions=2), helper)
