"""The zoo's config.json files: each family's real keys and layer pattern, shrunk to a tiny model.

Every config carries the keys its real checkpoint's config.json has (mlx-lm reads only some of them,
but a config shaped like the real one is what a user's folder looks like). Shared sizes keep the
models comparable: hidden 64, 8 query and 4 KV heads of 16, MLP widths and expert counts that
divide by 4, so 2- and 4-way tensor parallelism can split them wherever mlx-lm has shard().
Windows are short (32 tokens) so that tests easily exceed them.
"""

from __future__ import annotations

from collections.abc import Callable

HIDDEN, HEADS, KV_HEADS, HEAD_DIM = 64, 8, 4, 16
INTERMEDIATE, EXPERT_INTERMEDIATE, EXPERTS, EXPERTS_PER_TOKEN = 128, 64, 8, 2
WINDOW = 32
CONTEXT_LENGTH = 131072


def _common(vocab: int, eos_id: int, pad_id: int) -> dict:
    return {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": CONTEXT_LENGTH,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "attention_dropout": 0.0,
        # Untied: with a tied head, a hidden state dominated by the current token's embedding makes
        # greedy decoding repeat that token forever.
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": [eos_id, pad_id],
        "pad_token_id": pad_id,
    }


def llama(c: dict) -> dict:
    return c | {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 2,
        "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1, "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                         "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    }


def qwen3(c: dict) -> dict:
    return c | {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "num_hidden_layers": 2,
        "attention_bias": False, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "rope_scaling": None,
        "sliding_window": None, "use_sliding_window": False, "max_window_layers": 2,
    }


def qwen3_moe(c: dict) -> dict:
    return qwen3(c) | {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
        "decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "num_experts": EXPERTS, "num_experts_per_tok": EXPERTS_PER_TOKEN, "norm_topk_prob": True,
        "output_router_logits": False, "router_aux_loss_coef": 0.001,
    }


def _gated_deltanet(layers: int) -> dict:
    # Three linear-attention (Gated DeltaNet) layers to one full-attention layer, as in the real models.
    return {
        "num_hidden_layers": layers, "full_attention_interval": 4,
        "layer_types": ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": HEAD_DIM, "linear_value_head_dim": HEAD_DIM,
        "linear_num_key_heads": 4, "linear_num_value_heads": 8,
        "attention_bias": False, "rms_norm_eps": 1e-6, "partial_rotary_factor": 0.25,
    }


def qwen3_5(c: dict) -> dict:
    # A vision-language checkpoint whose language model sits in text_config; mlx-lm's save_config
    # drops vision_config, as the mlx-community conversions show.
    text = c | _gated_deltanet(4) | {
        "model_type": "qwen3_5_text", "attn_output_gate": True, "mtp_num_hidden_layers": 0,
        "rope_parameters": {"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                            "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
    }
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": text, "tie_word_embeddings": False, "torch_dtype": "float32",
        "eos_token_id": c["eos_token_id"], "pad_token_id": c["pad_token_id"],
    }


def qwen3_5_moe(c: dict) -> dict:
    # Qwen3.5's mixture-of-experts checkpoints (35B-A3B and up): Qwen3-Next's experts in Qwen3.5's layers.
    cfg = qwen3_5(c)
    text = cfg["text_config"] | _moe() | {"model_type": "qwen3_5_moe_text"}
    return cfg | {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
                  "text_config": text}


def _moe() -> dict:
    return {"decoder_sparse_step": 1, "mlp_only_layers": [], "moe_intermediate_size": EXPERT_INTERMEDIATE,
            "shared_expert_intermediate_size": EXPERT_INTERMEDIATE, "num_experts": EXPERTS,
            "num_experts_per_tok": EXPERTS_PER_TOKEN, "norm_topk_prob": True, "output_router_logits": False,
            "router_aux_loss_coef": 0.001}


def qwen3_next(c: dict) -> dict:
    return c | _gated_deltanet(4) | {
        "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next",
        "rope_theta": 10000000.0, "rope_scaling": None,
    } | _moe()


def deepseek_v3(c: dict) -> dict:
    # Multi-head latent attention: one compressed latent (kv_lora_rank) and one shared RoPE key per
    # token and layer; the first layer dense, the rest MoE with grouped routing, as in the real model.
    return {k: v for k, v in c.items() if k != "head_dim"} | {
        "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "num_hidden_layers": 2,
        "num_key_value_heads": HEADS, "q_lora_rank": 32, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "moe_intermediate_size": EXPERT_INTERMEDIATE,
        "n_routed_experts": EXPERTS, "n_shared_experts": 1, "num_experts_per_tok": EXPERTS_PER_TOKEN,
        "n_group": 2, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",
        "norm_topk_prob": True, "routed_scaling_factor": 2.5, "aux_loss_alpha": 0.001,
        "num_nextn_predict_layers": 0, "attention_bias": False, "rms_norm_eps": 1e-6,
        "max_position_embeddings": 163840, "rope_theta": 10000.0,
        "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                         "original_max_position_embeddings": 4096, "type": "yarn"},
    }


def gpt_oss(c: dict) -> dict:
    # Sliding-window and full attention layers alternating, attention sinks, biased experts.
    return c | {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW,
        "intermediate_size": EXPERT_INTERMEDIATE, "num_local_experts": EXPERTS,
        "num_experts_per_tok": EXPERTS_PER_TOKEN, "experts_per_token": EXPERTS_PER_TOKEN,
        "attention_bias": True, "rms_norm_eps": 1e-5, "swiglu_limit": 7.0, "initial_context_length": 4096,
        "rope_theta": 150000,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "output_router_logits": False, "router_aux_loss_coef": 0.9,
    }


def glm4_moe(c: dict) -> dict:
    return c | {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "num_hidden_layers": 2,
        "first_k_dense_replace": 1, "moe_intermediate_size": EXPERT_INTERMEDIATE, "n_routed_experts": EXPERTS,
        "n_shared_experts": 1, "num_experts_per_tok": EXPERTS_PER_TOKEN, "n_group": 1, "topk_group": 1,
        "norm_topk_prob": True, "routed_scaling_factor": 1.0, "num_nextn_predict_layers": 0,
        "partial_rotary_factor": 0.5, "use_qk_norm": False, "attention_bias": True,
        "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "rope_scaling": None,
    }


def ministral3(c: dict) -> dict:
    # Sliding-window and full attention layers mixed, and Llama 4's position-dependent query scale.
    return c | {
        "architectures": ["Ministral3ForCausalLM"], "model_type": "ministral3", "num_hidden_layers": 2,
        "layer_types": ["sliding_attention", "full_attention"], "sliding_window": WINDOW,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 262144,
        "rope_parameters": {"type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                            "original_max_position_embeddings": 16384, "max_position_embeddings": 262144,
                            "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                            "llama_4_scaling_beta": 0.1},
    }


_BUILDERS: dict[str, Callable[[dict], dict]] = {
    "llama": llama, "qwen3": qwen3, "qwen3-moe": qwen3_moe, "qwen3.5": qwen3_5, "qwen3-next": qwen3_next,
    "qwen3.5-moe": qwen3_5_moe,
    "deepseek-v3": deepseek_v3, "gpt-oss": gpt_oss, "glm4-moe": glm4_moe, "ministral3": ministral3,
}


# A real checkpoint's shape, shrunk: SmolLM2's 9 query heads and 3 KV heads (hidden 576 = 9 x 64), as 9 x 8.
# The widths divide by 2 and by 3, so on 2 ranks only the head counts stop tensor parallelism. Its dtypes
# are SmolLM2's GGUF's too (store.py): float16 weights, float32 norms, so activations change dtype in layer 1.
SHAPES = {"llama-9-heads": {"hidden_size": 72, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 8,
                            "intermediate_size": 144, "torch_dtype": "float16"}}


def config(family: str, vocab: int, eos_id: int, pad_id: int) -> dict:
    """The unquantized config.json of zoo family `family` (one of engine.zoo.names.FAMILIES)."""
    return _BUILDERS[family](_common(vocab, eos_id, pad_id))
