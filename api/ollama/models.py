"""The served model as Ollama describes models (/api/tags, /api/show, /api/ps), from the engine's Info.

Ollama reports models it runs from safetensors (its MLX runner's) with format "safetensors", the
config's model_type as family, and model_info keys named after the architecture, which clients read
("<architecture>.context_length" is VS Code Copilot's context window).
"""

from __future__ import annotations

import hashlib
import time

import ipc
from ipc.messages import ModelFacts
from api.ollama.protocol import ListedModel, ModelDetails, RunningModel, ShowResponse
from api.ollama.render import timestamp
from config import Settings

# What /api/version answers: the first Ollama release whose /api has everything this dialect speaks
# (logprobs and top_logprobs came in 0.12.11, tool_call_id in 0.12.10); clients refuse servers older
# than their minimum (VS Code Copilot: 0.6.4).
OLLAMA_VERSION = "0.12.11"
FORMAT = "safetensors"
# The model never unloads; Ollama's CLI shows an expiry this far away as "Forever".
FOREVER_SECONDS = 100 * 365 * 86400
# config.json key -> Ollama's model_info key after "<architecture>."
_MODEL_INFO = {
    "hidden_size": "embedding_length",
    "num_hidden_layers": "block_count",
    "num_attention_heads": "attention.head_count",
    "num_key_value_heads": "attention.head_count_kv",
    "intermediate_size": "feed_forward_length",
    "vocab_size": "vocab_size",
    "rms_norm_eps": "attention.layer_norm_rms_epsilon",
    "rope_theta": "rope.freq_base",
}


def digest(settings: Settings) -> str:
    """A stable digest for the served model (Ollama's is its manifest's sha256)."""
    return hashlib.sha256(settings.model_name.encode()).hexdigest()


def human_number(n: int) -> str:
    """Ollama's parameter_size spelling: 7.6B, 135.31M, 213K."""
    for unit, scale, places in (("B", 10**9, 1), ("M", 10**6, 2)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.{places}f}{unit}"
    return f"{n / 1000:.0f}K" if n >= 1000 else str(n)


def quantization_level(facts: ModelFacts) -> str:
    """int4, int8 (mlx's affine modes), mxfp4, nvfp4, ...; an unquantized model's dtype (bfloat16)."""
    if facts.quantization_bits:
        mode = facts.quantization_mode
        return f"int{facts.quantization_bits}" if mode in ("", "affine") else mode
    return facts.dtype


def details(info: ipc.Info) -> ModelDetails:
    facts = info.facts or ModelFacts()
    family = facts.architecture
    return ModelDetails(format=FORMAT, family=family, families=[family] if family else [],
                        parameter_size=human_number(facts.parameters) if facts.parameters else "",
                        quantization_level=quantization_level(facts))


def listed(info: ipc.Info, settings: Settings) -> ListedModel:
    size = info.facts.weight_bytes if info.facts else 0
    return ListedModel(name=settings.model_name, model=settings.model_name, modified_at=timestamp(info.created),
                       size=size, digest=digest(settings), details=details(info))


def running(info: ipc.Info, settings: Settings) -> RunningModel:
    """Every rank's memory in use (weights and caches) once ranks report it, else the weights' size; Apple
    silicon's memory is all the GPU's."""
    used = sum(r.active_memory for r in info.rank_states)
    size = used or (info.facts.weight_bytes if info.facts else 0)
    return RunningModel(name=settings.model_name, model=settings.model_name, size=size, digest=digest(settings),
                        details=details(info), expires_at=timestamp(time.time() + FOREVER_SECONDS), size_vram=size,
                        context_length=info.context_length)


def capabilities(info: ipc.Info) -> list[str]:
    """completion; tools when the model's tool calls are parsed (assumed of an engine that does not say);
    vision when it takes images; thinking when its tokenizer knows think markers (Ollama's order)."""
    facts = info.facts
    out = ["completion"]
    if facts is None or facts.tool_calling:
        out.append("tools")
    if facts is not None and facts.vision:
        out.append("vision")
    if facts is not None and facts.thinking:
        out.append("thinking")
    return out


def show(info: ipc.Info, settings: Settings) -> ShowResponse:
    facts = info.facts or ModelFacts()
    arch = facts.architecture or "unknown"
    model_info: dict[str, object] = {"general.architecture": arch, "general.basename": settings.model_name}
    if facts.parameters:
        model_info["general.parameter_count"] = facts.parameters
    model_info[f"{arch}.context_length"] = info.context_length
    for key, name in _MODEL_INFO.items():
        if key in facts.config:
            model_info[f"{arch}.{name}"] = facts.config[key]
    # Ollama's -1: no limit but the context's (and here the KV budget's)
    parameters = {"num_ctx": info.context_length, "num_predict": settings.MAX_TOKENS_DEFAULT or -1}
    modelfile = (f'# Modelfile generated by "ollama show"\n# mlx-cluster-serve loads this one model at start: '
                 f"it cannot be pulled, created, copied or deleted here\nFROM {info.model_path}\n"
                 + "".join(f"PARAMETER {k} {v}\n" for k, v in parameters.items()))
    return ShowResponse(
        modelfile=modelfile,
        parameters="\n".join(f"{k:<30} {v}" for k, v in parameters.items()),
        template=facts.chat_template,
        details=details(info),
        model_info=model_info,
        capabilities=capabilities(info),
        modified_at=timestamp(info.created),
    )


def _helper_details(helper: ipc.HelperState) -> ModelDetails:
    return ModelDetails(format=FORMAT, family=helper.family, families=[helper.family], parameter_size="",
                        quantization_level="")


def listed_helper(helper: ipc.HelperState, info: ipc.Info) -> ListedModel:
    """A helper model (embeddings, rerank) beside the served one; its digest from its own name."""
    return ListedModel(name=helper.name, model=helper.name, modified_at=timestamp(info.created),
                       size=helper.weight_bytes, digest=hashlib.sha256(helper.name.encode()).hexdigest(),
                       details=_helper_details(helper))


def show_helper(helper: ipc.HelperState, info: ipc.Info) -> ShowResponse:
    """/api/show of a helper: Ollama's "embedding" capability for an embedder (a reranker says "rerank")."""
    model_info: dict[str, object] = {"general.architecture": helper.family, "general.basename": helper.name,
                                     f"{helper.family}.context_length": helper.max_tokens}
    if helper.dimensions:
        model_info[f"{helper.family}.embedding_length"] = helper.dimensions
    return ShowResponse(modelfile=f"# a {helper.kind} model loaded beside the served one\nFROM {helper.path}\n",
                        parameters="", template="", details=_helper_details(helper), model_info=model_info,
                        capabilities=[helper.kind], modified_at=timestamp(info.created))
