"""Rerank inputs longer than the reranker's context: rank 0 cuts a document's end to fit (the default of Cohere, Jina
and vLLM), or refuses it naming the document when truncation is off; the query is never cut, and a query that
leaves no room for any document is refused either way. Driven without MLX through the desk's own checks."""

from __future__ import annotations

import queue

import pytest

from engine.rank0.errors import Refused
from engine.rank0.helper_desk import HelperDesk
from ipc import Rerank


class FakeReranker:
    """A pair is [CLS] query-words [SEP] document-words [SEP] (a word is one token: its length); limit cuts the
    document's words, as each family's pair_tokens does."""

    kind, name, max_tokens, dimensions, matryoshka = "rerank", "fake", 12, 0, False

    def pair_tokens(self, query: str, document: str, limit: int | None = None) -> list[int]:
        q, d = [len(w) for w in query.split()], [len(w) + 10 for w in document.split()]
        if limit is not None:
            d = d[:max(0, limit - len(q) - 3)]
        return [1, *q, 2, *d, 2]


def pairs(**fields) -> list[list[int]]:
    desk = HelperDesk({}, queue.SimpleQueue(), max_inputs=8, timeout=1)
    return desk._tokens(Rerank(request_id="r", **fields), FakeReranker())


def test_a_long_document_is_cut_at_its_end_to_fit_and_the_query_kept_whole():
    long_doc = " ".join(f"w{i}" for i in range(30))
    got = pairs(query="where is it", documents=["short one", long_doc], truncate=True)
    assert got[0] == [1, 5, 2, 2, 2, 15, 13, 2]  # fits: untouched
    assert len(got[1]) == 12 and got[1][:5] == [1, 5, 2, 2, 2] and got[1][-1] == 2
    assert got[1][5:-1] == [12] * 6  # the document's first words, its end gone


def test_without_truncation_a_long_document_is_refused_by_its_index():
    with pytest.raises(Refused) as refused:
        pairs(query="q", documents=["fine", "a b c d e f g h i j k"], truncate=False)
    error = refused.value.error
    assert (error.status, error.param, error.code) == (400, "documents[1]", "context_length_exceeded")
    assert "15 tokens long" in error.message and "limit of 12" in error.message and "truncate" in error.message


@pytest.mark.parametrize("truncate", [True, False])
def test_a_query_that_leaves_no_room_for_a_document_is_refused_either_way(truncate):
    with pytest.raises(Refused) as refused:
        pairs(query=" ".join(["word"] * 9), documents=["d"], truncate=truncate)
    error = refused.value.error
    assert error.param == "query" and "shorten the query" in error.message and error.status == 400


def test_max_tokens_per_doc_cuts_every_document_to_that_many_tokens():
    got = pairs(query="q", documents=["a b c d", "a", " ".join(["x"] * 20)], truncate=True, max_tokens_per_doc=2)
    assert [len(ids) - 4 for ids in got] == [2, 1, 2]  # less [CLS] q [SEP] ... [SEP]: the documents' own tokens
