"""Tensor parallel on two real ranks for the zoo models that differ in kind (MLA + MoE, a hybrid of linear and full
attention, sliding windows with attention sinks + MoE): greedy answers, alone and in a batch, equal mlx-lm's own
sharded load (sharded_load(tensor_group=...) under mlx.launch), with the prefix cache on and off."""

from __future__ import annotations

import pytest

from tests.multirank.test_pipeline import CACHE_OFF, answers, mlx_lm_pipelined

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("name", ["deepseek-v3", "qwen3.5", "gpt-oss"])
def test_two_ranks_in_tensor_parallel_answer_as_mlx_lm_sharded(name, tmp_path):
    reference = mlx_lm_pipelined(name, tmp_path, mode="tensor")
    for settings in (CACHE_OFF, {}):
        alone, together, log, _ = answers(name, **settings)
        assert alone == reference, f"zoo-{name} {settings or 'cache on'}: alone"
        assert together == reference, f"zoo-{name} {settings or 'cache on'}: in a batch"
        assert "pipeline parallel" not in log
