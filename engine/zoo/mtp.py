"""Zoo models carrying multi-token-prediction layers, under the names real checkpoints give them.

Each is its family's zoo model (the same main weights: the draws are keyed by parameter name) whose config.json
declares num_nextn_predict_layers = 1 and whose safetensors add model.layers.<num_hidden_layers>.* as the
Hugging Face checkpoint stores them: experts one by one (mlx-lm's sanitize stacks them), DeepSeek's kv_b_proj
whole (sanitize splits it), the layer's own embed_tokens and shared_head.head where the real model ships them.
mlx-lm's glm4_moe drops model.layers.<num_hidden_layers> at load, so GLM's heads sit in model.safetensors.
Its deepseek_v3 drops model.layers.61 only (DeepSeek-V3's own depth), so the 2-layer zoo model keeps its head
in mtp.safetensors, a file mlx-lm does not read (it loads model*.safetensors). Qwen3-Next and Qwen3.5 name theirs
mtp.* and come as raw Hugging Face checkpoints (engine/zoo/mtp_qwen.py).
"""

from __future__ import annotations

import importlib
from typing import Any

from engine.zoo import mtp_qwen

# model_types whose MTP layer ships its own embed_tokens and shared_head.head (DeepSeek-V3 does; else shared)
OWN_HEAD = {"deepseek_v3"}
ATTENTION_SCALE = 0.05
COPIES = {"embed_tokens.weight": "model.embed_tokens.weight", "shared_head.head.weight": "lm_head.weight"}
HEADS_FILE = {"deepseek_v3": "mtp.safetensors"}  # else model.safetensors, beside the main weights


def main_model(name: str, model: Any) -> Any:
    """The main model of zoo model `name`; a "-trained" one's attention damped (its o_proj scaled by
    ATTENTION_SCALE): the zoo's random models wander, so that their greedy next token follows the current token
    only 21% of the time and a briefly trained head agrees with them on unseen prompts ~1% of the time; damped,
    93%, and the head learns what the model does."""
    if name.endswith("-trained"):
        for layer in model.model.layers:
            # a Gated DeltaNet layer's (Qwen3.5, Qwen3-Next) output projection is its out_proj
            out = layer.self_attn.o_proj if "self_attn" in layer else layer.linear_attn.out_proj
            out.weight = out.weight * ATTENTION_SCALE
    return model


def heads(name: str, model: Any, cfg: dict, hidden: int, quiet_ids: list[int]) -> tuple[dict[str, Any], dict]:
    """The MTP tensors of zoo model `name`: drawn, and for a "-trained" one trained on `model`'s own greedy
    continuations (engine/zoo/mtp_train.py), with what training measured (for the marker file)."""
    qwen = cfg["model_type"] in mtp_qwen.FAMILIES
    tensors, facts = (mtp_qwen.head_tensors if qwen else head_tensors)(cfg, hidden, quiet_ids), {}
    if name.endswith("-trained"):
        from engine.zoo.mtp_train import trained

        tensors, facts = trained(model, cfg, tensors, quiet_ids)
    return dict(sorted(tensors.items())), facts


def mtp_config(cfg: dict) -> dict:
    if cfg["model_type"] in mtp_qwen.FAMILIES:
        return mtp_qwen.mtp_config(cfg)
    return cfg | {"num_nextn_predict_layers": 1}


def main_tensors(cfg: dict, tensors: dict[str, Any]) -> dict[str, Any]:
    """The main model's tensors as the checkpoint stores them: Qwen's in raw Hugging Face form, others as mlx-lm's."""
    return mtp_qwen.raw(tensors, cfg["model_type"]) if cfg["model_type"] in mtp_qwen.FAMILIES else tensors


def head_tensors(cfg: dict, hidden: int, quiet_ids: list[int]) -> dict[str, Any]:
    """model.layers.<num_hidden_layers>.* in the checkpoint's form, drawn by name as the zoo's other weights."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.zoo.weights import _value

    arch = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    args = arch.ModelArgs.from_dict(cfg)
    layers = cfg["num_hidden_layers"]
    prefix = f"model.layers.{layers}."
    block = type(arch.Model(args).model.layers[0])(args, layers)
    shapes = {f"mtp_block.{n}": tuple(p.shape) for n, p in tree_flatten(block.parameters())}
    shapes = _checkpoint_shapes(shapes, cfg)
    dims, vocab = cfg["hidden_size"], cfg["vocab_size"]
    shapes |= {"enorm.weight": (dims,), "hnorm.weight": (dims,), "eh_proj.weight": (dims, 2 * dims),
               "shared_head.norm.weight": (dims,)}
    if cfg["model_type"] in OWN_HEAD:
        shapes |= {"embed_tokens.weight": (vocab, dims), "shared_head.head.weight": (vocab, dims)}
    family = cfg["model_type"]
    tensors = {}
    for name, shape in sorted(shapes.items()):
        full = prefix + name.removeprefix("mtp_block.")
        # DeepSeek-V3's MTP layer ships copies of the main embedding and lm_head: drawn under their names
        rule = COPIES.get(name, full)
        tensors[full] = mx.array(_value(family, rule, shape, hidden, quiet_ids))
    return tensors


def _checkpoint_shapes(shapes: dict[str, tuple], cfg: dict) -> dict[str, tuple]:
    """mlx-lm's parameter shapes back in the checkpoint's names: experts one by one, MLA's kv_b_proj whole."""
    out = {}
    for name, shape in shapes.items():
        if ".switch_mlp." in name:
            for e in range(shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = shape[1:]
        elif name.endswith("self_attn.embed_q.weight"):
            heads = cfg["num_attention_heads"]
            rows = heads * (cfg["qk_nope_head_dim"] + cfg["v_head_dim"])
            out[name.replace("embed_q", "kv_b_proj")] = (rows, cfg["kv_lora_rank"])
        elif not name.endswith("self_attn.unembed_out.weight"):
            out[name] = shape
    return out
