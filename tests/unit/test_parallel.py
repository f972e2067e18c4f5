"""Which parallel mode several ranks run a model in, how pipeline ranks split its layers, and the KV one token
takes on a pipeline rank: decided without MLX from what mlx-lm's class for the model can do."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from config import ConfigError, load_settings
from engine.parallel import (AUTO, PIPELINE, SINGLE, TENSOR, Abilities, ParallelRefused, checked_split, choose,
                             holds_heads, last_stage, memory_weights, split_layers, stage_layers)
from engine.rank0.kv_budget import token_bytes

BOTH = Abilities("deepseek_v3", tensor=True, pipeline=True, uneven=True)
SHARD_ONLY = Abilities("gpt_oss", tensor=True, pipeline=False)
PIPELINE_ONLY = Abilities("qwen3_next", tensor=False, pipeline=True, uneven=True)
NEITHER = Abilities("gemma3n", tensor=False, pipeline=False)
# what shard() divides unevenly, as engine/split_probe.py words it (SmolLM2's shape on 2 ranks)
NINE_HEADS = ("tensor parallel needs 9 attention heads (self_attn.n_heads) and 3 KV heads (self_attn.n_kv_heads) "
              "divisible by 2 ranks")
UNEVEN_BOTH = Abilities("llama", tensor=True, pipeline=True, uneven=True, unsplit=NINE_HEADS)
UNEVEN_SHARD_ONLY = Abilities("gpt_oss", tensor=True, pipeline=False,
                              unsplit="tensor parallel needs 8 KV heads (self_attn.num_key_value_heads) divisible "
                                      "by 3 ranks")


def test_one_rank_runs_any_model_whole():
    for can in (BOTH, SHARD_ONLY, PIPELINE_ONLY, NEITHER, UNEVEN_BOTH, UNEVEN_SHARD_ONLY):
        for requested in (AUTO, TENSOR, PIPELINE):
            assert choose(requested, 1, can) == (SINGLE, "")


def test_tensor_is_the_default_and_pipeline_runs_when_asked():
    assert choose(AUTO, 2, BOTH) == (TENSOR, "")
    assert choose(TENSOR, 2, BOTH) == (TENSOR, "")
    assert choose(PIPELINE, 2, BOTH) == (PIPELINE, "")
    assert choose(TENSOR, 4, SHARD_ONLY) == (TENSOR, "")


def test_a_model_mlx_lm_cannot_shard_is_pipelined_with_a_line_saying_so():
    mode, note = choose(AUTO, 2, PIPELINE_ONLY)
    assert mode == PIPELINE
    assert "qwen3_next has no tensor parallelism in mlx-lm" in note and "pipeline parallel" in note


def test_a_model_that_can_do_neither_is_refused_with_the_architecture_why_and_what_to_do():
    for requested in (AUTO, TENSOR, PIPELINE):
        with pytest.raises(ParallelRefused) as refused:
            choose(requested, 2, NEITHER)
        text = str(refused.value)
        assert text.count(". ") == 0 and "\n" not in text  # one sentence
        assert "gemma3n cannot run on 2 ranks" in text
        assert "no shard()" in text and "no pipeline()" in text
        assert "serve it on one host (HOSTS with a single entry)" in text


def test_pipeline_asked_of_a_model_mlx_lm_only_shards_is_refused_not_switched():
    with pytest.raises(ParallelRefused, match=r"gpt_oss cannot run in pipeline parallel on 2 ranks: mlx-lm's "
                                              r"gpt_oss model has no pipeline\(\); set PARALLEL=tensor"):
        choose(PIPELINE, 2, SHARD_ONLY)


def test_equal_shares_split_as_mlx_lm_does_low_ranks_taking_the_extra_layers():
    assert split_layers(4, [1, 1]) == [2, 2]
    assert split_layers(5, [1, 1]) == [3, 2]
    assert split_layers(61, [1, 1, 1, 1]) == [16, 15, 15, 15]
    assert split_layers(61, [8.0, 8.0, 8.0, 8.0]) == [16, 15, 15, 15]


def test_unequal_memory_gets_layers_in_proportion_and_every_rank_at_least_one():
    assert split_layers(32, [192, 64]) == [24, 8]
    assert split_layers(61, [512, 192, 96]) == [38, 15, 8]
    assert sum(split_layers(61, [512, 192, 96])) == 61
    assert split_layers(4, [1000, 1, 1]) == [2, 1, 1]
    with pytest.raises(ParallelRefused, match="fewer than the 3 ranks"):
        split_layers(2, [1, 1, 1])


def test_ranks_on_one_host_share_its_memory():
    assert memory_weights([64, 64, 192], ["a", "a", "b"]) == [32, 32, 192]
    assert split_layers(4, memory_weights([100, 100], ["h", "h"])) == [2, 2]


def test_pipeline_layers_must_fit_the_model_and_the_ranks():
    assert checked_split([3, 1], 4, 2) == [3, 1]
    with pytest.raises(ParallelRefused, match=r"PIPELINE_LAYERS=3,2 does not fit: the model has 4 layers on 2 "
                                              r"ranks, so give 2 positive counts summing to 4"):
        checked_split([3, 2], 4, 2)


def test_settings_name_the_variable_and_the_accepted_values(tmp_path: Path):
    env = tmp_path / ".env"
    env.write_text("")
    two = {"HOSTS": "127.0.0.1,127.0.0.1"}
    assert load_settings({}, env).PARALLEL == "auto"
    s = load_settings({**two, "PARALLEL": "pipeline", "PIPELINE_LAYERS": "3, 1"}, env)
    assert s.PARALLEL == "pipeline" and s.pipeline_layers == [3, 1]
    with pytest.raises(ConfigError, match=r"PARALLEL='pipe' is not valid: expected one of auto, tensor, pipeline"):
        load_settings({"PARALLEL": "pipe"}, env)
    with pytest.raises(ConfigError, match=r"PIPELINE_LAYERS='3,0' is not valid: expected comma-separated positive"):
        load_settings({**two, "PARALLEL": "pipeline", "PIPELINE_LAYERS": "3,0"}, env)
    with pytest.raises(ConfigError, match=r"PIPELINE_LAYERS='3,1' needs PARALLEL=pipeline"):
        load_settings({**two, "PIPELINE_LAYERS": "3,1"}, env)
    with pytest.raises(ConfigError, match=r"gives 3 layer count\(s\) for 2 rank\(s\)"):
        load_settings({**two, "PARALLEL": "pipeline", "PIPELINE_LAYERS": "1,1,2"}, env)


def test_a_pipeline_rank_holds_its_layers_with_all_their_heads():
    config = {"num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128}
    whole = token_bytes(config, 1, "bfloat16")
    assert token_bytes(config, 2, "bfloat16") == whole // 2  # tensor: half the heads on each rank
    assert token_bytes(config, 2, "bfloat16", pipeline_layers=24) == whole // 2  # pipeline: half the layers
    assert token_bytes(config, 2, "bfloat16", pipeline_layers=36) == 36 * 2 * 4 * 128 * 2


def one_sentence(text: str) -> bool:
    return text.count(". ") == 0 and "\n" not in text


def test_heads_the_ranks_cannot_divide_are_pipelined_by_default_saying_why():
    mode, note = choose(AUTO, 2, UNEVEN_BOTH)
    assert mode == PIPELINE
    assert note == NINE_HEADS + ": running it in pipeline parallel, each of the 2 ranks holding whole layers"
    assert choose(PIPELINE, 2, UNEVEN_BOTH) == (PIPELINE, "")


def test_tensor_asked_explicitly_of_heads_the_ranks_cannot_divide_is_refused_not_switched():
    with pytest.raises(ParallelRefused) as refused:
        choose(TENSOR, 2, UNEVEN_BOTH)
    text = str(refused.value)
    assert one_sentence(text)
    assert text == (f"PARALLEL=tensor cannot run MODEL on 2 ranks: {NINE_HEADS}; set PARALLEL=pipeline (or auto) "
                    "to split its layers instead")


def test_heads_the_ranks_cannot_divide_without_a_pipeline_are_refused_in_one_sentence():
    for requested in (AUTO, TENSOR, PIPELINE):
        with pytest.raises(ParallelRefused) as refused:
            choose(requested, 3, UNEVEN_SHARD_ONLY)
        text = str(refused.value)
        assert one_sentence(text)
        assert text.startswith("MODEL's architecture gpt_oss cannot run on 3 ranks: tensor parallel needs 8 KV heads")
        assert "mlx-lm's gpt_oss model has no pipeline()" in text
        assert "serve it on a number of hosts that divides them, or on one host" in text


def test_status_and_health_say_why_the_ranks_run_pipelined():
    from api.health import details
    from ipc.messages import Info
    from ops.status import describe_info

    note = NINE_HEADS + ": running it in pipeline parallel, each of the 2 ranks holding whole layers"
    info = Info(model="m", model_path="/m", context_length=4096, ranks=2, backend="ring", created=0, engine_pid=1,
                parallel=PIPELINE, pipeline_layers=[1, 1], parallel_note=note)
    lines = describe_info(info).splitlines()
    assert "(pipeline parallel: layers 1 + 1)" in lines[1] and lines[2].strip() == note
    assert details(info)["parallel_note"] == note


def _mlx_lm_stages(split: list[int]) -> list[range]:
    """The layers each rank keeps under mlx-lm's own PipelineMixin.pipeline() (its module imports nothing: read from
    the installed mlx_lm's folder without importing mlx), run over a stand-in holding one entry per layer."""
    folder = importlib.util.find_spec("mlx_lm").submodule_search_locations[0]
    spec = importlib.util.spec_from_file_location("mlx_lm_pipeline", f"{folder}/models/pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = []
    for rank in range(len(split)):
        stage = module.PipelineMixin()
        stage.layers = list(range(sum(split)))
        stage.pipeline(type("Group", (), {"rank": lambda self, r=rank: r, "size": lambda self: len(split)})(), split)
        out.append(range(stage.pipeline_layers[0], stage.pipeline_layers[-1] + 1))
    return out


@pytest.mark.parametrize("split", [[1, 1], [12, 12], [20, 12], [3, 9], [10, 8, 6], [1, 1, 1, 5]])
def test_pipeline_stages_hold_the_layers_mlx_lm_gives_them_and_rank_0_the_last(split):
    assert [stage_layers(split, r) for r in range(len(split))] == _mlx_lm_stages(split)
    assert last_stage(split) == 0


def test_mtp_heads_sit_on_every_tensor_rank_and_on_the_last_pipeline_stage_only():
    # tensor parallel shards them (their all_sums meet on every rank); pipeline keeps them whole beside the final
    # hidden state, on rank 0, where the proposer reads their drafts
    assert holds_heads(SINGLE, 0, [])
    assert all(holds_heads(TENSOR, r, []) for r in range(4))
    assert [holds_heads(PIPELINE, r, [20, 12]) for r in range(2)] == [True, False]
    assert [holds_heads(PIPELINE, r, [10, 8, 6]) for r in range(3)] == [True, False, False]
