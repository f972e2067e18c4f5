"""Zoo models carrying Qwen3-Next's and Qwen3.5's MTP layers (mtp.*), written as raw Hugging Face checkpoints.

A real checkpoint with these heads is the Hugging Face one (mlx_lm.convert drops them), so these models are stored in
its form, main layers and heads alike, all in model.safetensors: experts one by one (Qwen3.5-MoE's fused, gate and
up projections in one gate_up_proj, as mlx-lm's qwen3_5_moe reads them), the conv1d weight as (channels, 1, kernel), RMSNorm scales zero-centred (Qwen's RMSNorm multiplies by 1 + w; the Gated DeltaNet's gated norm does
not), Qwen3.5's language model under model.language_model. mlx-lm's sanitize turns the main layers back into the
family's zoo model (the same draws, by parameter name) and drops mtp.*.
"""

from __future__ import annotations

import importlib
from typing import Any

FAMILIES = ("qwen3_next", "qwen3_5", "qwen3_5_moe")
FUSED_EXPERTS = ("qwen3_5_moe",)
# the parameters of the MTP module beside its decoder layer (vLLM's qwen3_next_mtp.py)
OWN = ("fc", "norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden")


def mtp_config(cfg: dict) -> dict:
    """One MTP layer, under the key each real config uses (Qwen3.5's text_config.mtp_num_hidden_layers)."""
    if "text_config" in cfg:
        return cfg | {"text_config": cfg["text_config"] | {"mtp_num_hidden_layers": 1}}
    return cfg | {"num_nextn_predict_layers": 1}


def head_tensors(cfg: dict, hidden: int, quiet_ids: list[int]) -> dict[str, Any]:
    """mtp.* drawn by name as the zoo's other weights, in the checkpoint's form: the decoder layer a full-attention
    one of the family (its index full_attention_interval - 1), fc taking [embedding, hidden]."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    from engine.zoo.weights import _value

    family = cfg["model_type"]
    arch = importlib.import_module(f"mlx_lm.models.{family}")
    model = arch.Model(arch.ModelArgs.from_dict(cfg))
    args = getattr(model, "language_model", model).args
    block = type(model.model.layers[0])(args, args.full_attention_interval - 1)
    shapes = {f"mtp.layers.0.{n}": tuple(p.shape) for n, p in tree_flatten(block.parameters())}
    dims = args.hidden_size
    shapes |= {f"mtp.{part}.weight": (dims, 2 * dims) if part == "fc" else (dims,) for part in OWN}
    drawn = {name: mx.array(_value(family, name, shape, hidden, quiet_ids)) for name, shape in sorted(shapes.items())}
    return raw(drawn, family)


def raw(tensors: dict[str, Any], family: str) -> dict[str, Any]:
    """mlx-lm's parameters (and mtp.*) in the Hugging Face checkpoint's form: what the family's sanitize undoes."""
    import mlx.core as mx

    out = {}
    for name, value in tensors.items():
        if family in FUSED_EXPERTS and ".switch_mlp." in name:
            if name.endswith("gate_proj.weight"):  # (experts, 2 * intermediate, hidden)
                up = tensors[name.replace("gate_proj", "up_proj")]
                out[_hf_name(name.replace("switch_mlp.gate_proj.weight", "experts.gate_up_proj"))] = \
                    mx.concatenate([value, up], axis=-2)
            elif name.endswith("down_proj.weight"):
                out[_hf_name(name.replace("switch_mlp.down_proj.weight", "experts.down_proj"))] = value
            continue
        if name.endswith(".weight") and "norm" in name.rsplit(".", 2)[-2] and ".linear_attn." not in name:
            value = value - 1.0
        if name.endswith("conv1d.weight"):
            value = mx.swapaxes(value, 1, 2)
        name = _hf_name(name)
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                out[name.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
        else:
            out[name] = value
    return dict(sorted(out.items()))


def _hf_name(name: str) -> str:
    if name.startswith("language_model.model."):
        return "model.language_model." + name.removeprefix("language_model.model.")
    return name.removeprefix("language_model.")  # language_model.lm_head -> lm_head
