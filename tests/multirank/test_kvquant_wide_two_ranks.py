"""KV_BITS=8 on two ranks for the cache kinds SmolLM2 lacks, heads 64 wide: MLA's latent in tensor parallel
(zoo-deepseek-v3-wide: each rank its heads, every rank the whole latent) and sliding windows in pipeline
(zoo-ministral3-wide: each rank its layers, one of them windowed). Greedy answers, alone and in a batch, are one
rank's at 8 bits (which differ from float's on one chat of deepseek-v3-wide: the check sees the quantization), and
the seeded samples agree on both ranks."""

from __future__ import annotations

import pytest

from tests.multirank.test_pipeline import answers

pytestmark = pytest.mark.multirank

QUANTIZED = {"KV_BITS": "8", "KV_GROUP_SIZE": "64"}


@pytest.mark.parametrize("name, parallel", [("deepseek-v3-wide", "tensor"), ("ministral3-wide", "pipeline")])
def test_two_ranks_with_quantized_kv_answer_as_one_rank_does(name, parallel):
    one_rank, _, _, _ = answers(name, ranks=1, **QUANTIZED)
    alone, together, log, info = answers(name, PARALLEL=parallel, **QUANTIZED)
    assert alone == one_rank
    assert together == one_rank
    assert info["parallel"] == parallel, info
