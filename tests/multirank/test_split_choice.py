"""A model whose head counts the ranks cannot divide: SmolLM2's shape, 9 query heads and 3 KV heads, in llama.

On 2 ranks tensor parallelism would load and then fail every request (shard() leaves 4 query heads against
1 KV head per rank), so the engine runs it in pipeline parallel, says why in its log and its status, and
answers as the model does whole (mlx-lm has no pipelined llama: a pipeline computes every layer whole, so
mlx-lm's one-process load is the reference). On 3 ranks the counts divide and tensor parallel answers as
mlx-lm's own sharded load. The model is a parameter: a real checkpoint of this shape joins as its folder.
"""

from __future__ import annotations

import pytest

from tests.launch_stack import Launch
from tests.multirank.test_pipeline import CACHE_OFF, answers, mlx_lm_pipelined

pytestmark = pytest.mark.multirank

# zoo names, or absolute model folders (SmolLM2-135M-Instruct once setup converts it)
NINE_HEADS = ["llama-9-heads"]
WHY = ("tensor parallel needs 9 attention heads (self_attn.n_heads) and 3 KV heads (self_attn.n_kv_heads) "
       "divisible by 2 ranks: running it in pipeline parallel")


@pytest.mark.parametrize("name", NINE_HEADS)
def test_two_ranks_that_cannot_split_the_heads_serve_it_pipelined_as_the_whole_model_answers(name, tmp_path):
    reference = mlx_lm_pipelined(name, tmp_path, mode="whole")
    alone, together, log, info = answers(name, **CACHE_OFF)
    assert alone == reference and together == reference
    assert WHY in log
    assert info["parallel"] == "pipeline" and info["parallel_note"].startswith(WHY)  # status and /health


def test_tensor_asked_of_heads_two_ranks_cannot_divide_is_refused_by_check():
    check = Launch(MODEL="zoo-llama-9-heads", PARALLEL="tensor", HOSTS="127.0.0.1,127.0.0.1").run("check")
    assert check.returncode == 1, check.stdout + check.stderr
    assert ("FAULT model: PARALLEL=tensor cannot run MODEL on 2 ranks: tensor parallel needs 9 attention heads "
            "(self_attn.n_heads) and 3 KV heads (self_attn.n_kv_heads) divisible by 2 ranks; set PARALLEL=pipeline "
            "(or auto)") in check.stdout


@pytest.mark.parametrize("name", NINE_HEADS)
def test_three_ranks_split_the_heads_and_answer_as_mlx_lm_sharded(name, tmp_path):
    reference = mlx_lm_pipelined(name, tmp_path, mode="tensor", ranks=3)
    alone, together, log, info = answers(name, ranks=3, **CACHE_OFF)
    assert alone == reference and together == reference
    assert (info["parallel"], info["parallel_note"]) == ("tensor", "")
