"""Whether N ranks can hold tensor-parallel slices of a model, asked of mlx-lm's own shard() for every zoo family
that has one: attention and KV heads, MLA heads, linear-attention heads, attention sinks, MoE expert widths.
A count shard() divides unevenly loads fine and fails every request later, so the probe must name it."""

from __future__ import annotations

import pytest

from engine.split_probe import unsplit
from engine.zoo.configs import SHAPES, config
from engine.zoo.names import FAMILIES

SHARDED = [f for f in FAMILIES if f != "qwen3-next"]  # mlx-lm's qwen3_next has no shard()


def built(family: str, **change):
    """mlx-lm's model for the zoo family's config with `change` applied (to the text model's config where the
    family nests one), built lazily: no weight is drawn."""
    from mlx_lm.utils import _get_classes

    cfg = config(family, 1024, 1, 2)
    target = cfg.get("text_config", cfg)
    target.update(change)
    model_class, args_class = _get_classes(cfg)
    return model_class(args_class.from_dict(cfg))


@pytest.mark.parametrize("family", SHARDED)
def test_the_zoo_shapes_split_over_2_and_4_ranks(family):
    for ranks in (2, 4):
        assert unsplit(built(family), ranks) == "", (family, ranks)


# heads the ranks cannot divide while every weight still slices evenly: the trap of SmolLM2 on 2 ranks
UNEVEN_HEADS = {
    "llama": ({"num_attention_heads": 12, "num_key_value_heads": 6}, "6 KV heads (self_attn.n_kv_heads)"),
    "qwen3": ({"num_attention_heads": 12, "num_key_value_heads": 6}, "6 KV heads (self_attn.n_kv_heads)"),
    "qwen3-moe": ({"num_attention_heads": 12, "num_key_value_heads": 6}, "6 KV heads (self_attn.n_kv_heads)"),
    "qwen3.5": ({"num_attention_heads": 12, "num_key_value_heads": 6},
                "6 KV heads (self_attn.num_key_value_heads)"),
    "deepseek-v3": ({"num_attention_heads": 6}, "6 attention heads (self_attn.num_heads)"),  # MLA
    "gpt-oss": ({"num_attention_heads": 12, "num_key_value_heads": 6},
                "6 KV heads (self_attn.num_key_value_heads)"),  # and its sinks, sliced by those heads
    "glm4-moe": ({"num_attention_heads": 12, "num_key_value_heads": 6}, "6 KV heads (self_attn.n_kv_heads)"),
    "ministral3": ({"num_attention_heads": 12, "num_key_value_heads": 6}, "6 KV heads (self_attn.n_kv_heads)"),
}


@pytest.mark.parametrize("family", SHARDED)
def test_heads_that_4_ranks_cannot_divide_are_named(family):
    change, named = UNEVEN_HEADS[family]
    assert unsplit(built(family, **change), 4) == f"tensor parallel needs {named} divisible by 4 ranks"


def test_linear_attention_heads_and_expert_widths_the_ranks_cannot_divide_are_refused():
    # Qwen3.5's Gated DeltaNet heads; Qwen3-MoE's and DeepSeek-V3's expert widths (mlx refuses the slice)
    for family, change in (("qwen3.5", {"linear_num_value_heads": 6, "linear_num_key_heads": 2}),
                           ("qwen3-moe", {"moe_intermediate_size": 66}),
                           ("deepseek-v3", {"moe_intermediate_size": 66})):
        said = unsplit(built(family, **change), 4)
        assert said.startswith(("mlx-lm's shard() cannot split it over 4 ranks (", "tensor parallel needs ")), said
        assert said and "\n" not in said, (family, said)


def test_smollm2s_shape_splits_over_3_ranks_not_2_or_4():
    shape = SHAPES["llama-9-heads"]
    for ranks in (2, 4):
        assert unsplit(built("llama", **shape), ranks) == (
            "tensor parallel needs 9 attention heads (self_attn.n_heads) and 3 KV heads (self_attn.n_kv_heads) "
            f"divisible by {ranks} ranks")
    assert unsplit(built("llama", **shape), 3) == ""
