"""Which cache kinds KV_BITS quantizes, and the one decision `launch.sh check` and the engine both make.

Each layer's fresh cache is asked what it is. A plain KVCache (dense and MoE attention) becomes a QuantizedKV;
when the model keeps MLA's latent in it (DeepSeek, Kimi: the attention reads the cached latent itself), a
QuantizedLatent, dequantized on fetch. A sliding window (RotatingKVCache) becomes a QuantizedRotating, unless the
model's attention has sinks (gpt-oss): mlx-lm's quantized attention does not take them. A linear-attention state
(ArraysCache) stays as it is. Any other kind (chunked or concatenating caches) is refused, never served in full
precision while KV_BITS says otherwise. mx.quantize works in groups of 32, 64 or 128 numbers of a token's
vector, so every quantized vector's length must be a multiple of KV_GROUP_SIZE.
"""

from __future__ import annotations

from typing import Any

from mlx.utils import tree_flatten
from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache, make_prompt_cache

from engine.kvquant.cache import QuantizedKV, QuantizedLatent
from engine.kvquant.rotating import QuantizedRotating

GROUP_SIZES = (32, 64, 128)  # what mx.quantize accepts
_NAMES = {"ChunkedKVCache": "chunked-attention layers (ChunkedKVCache)"}
_TAKEN = (KVCache, RotatingKVCache, ArraysCache)  # exactly these classes: a subclass may store differently


class KVQuantRefused(Exception):
    """KV_BITS cannot be applied to this model; the message says why and what to set."""


def _args(model: Any) -> Any:
    """The model's config arguments that describe its attention (a wrapper's language model's, for multimodal
    classes such as Qwen3.5's)."""
    for holder in (model, getattr(model, "language_model", None)):
        args = getattr(holder, "args", None)
        if any(getattr(args, name, None) for name in ("head_dim", "hidden_size", "kv_lora_rank")):
            return args
    return None


def is_latent(model: Any) -> bool:
    """Whether the model caches MLA's compressed latent (and its shared rotary key) in its KVCache layers."""
    return getattr(_args(model), "kv_lora_rank", None) is not None


def vector_sizes(model: Any) -> dict[str, int]:
    """The length of each vector a KV layer stores per token, by what the config calls it ({} when not told)."""
    args = _args(model)
    if args is None:
        return {}
    if is_latent(model):
        return {"kv_lora_rank": args.kv_lora_rank, "qk_rope_head_dim": args.qk_rope_head_dim}
    head = getattr(args, "head_dim", None)
    if head is None and getattr(args, "hidden_size", None) and getattr(args, "num_attention_heads", None):
        head = args.hidden_size // args.num_attention_heads
    sizes = {"head_dim": head} if head else {}
    if getattr(args, "v_head_dim", None):
        sizes["v_head_dim"] = args.v_head_dim
    return sizes


def has_sinks(model: Any) -> bool:
    """Whether the model's attention has learned sinks (gpt-oss), which mlx-lm's quantized attention refuses."""
    return any(name.rsplit(".", 1)[-1] == "sinks" for name, _ in tree_flatten(model.parameters()))


def _leaves(cache: list[Any]) -> list[Any]:
    out = []
    for c in cache:
        out.extend(_leaves(c.caches) if isinstance(c, CacheList) else [c])
    return out


def refusal(model: Any, bits: int | None, group_size: int, cache: list[Any] | None = None) -> str | None:
    """The sentence saying why KV_BITS=bits cannot be applied to model (a fresh cache of its own, or `cache`);
    None when it can, or when bits is None (off)."""
    if bits is None:
        return None
    layers = _leaves(cache if cache is not None else make_prompt_cache(model))
    for layer in layers:
        kind = type(layer).__name__
        if type(layer) not in _TAKEN:
            what = _NAMES.get(kind, f"{kind} layers")
            return f"KV_BITS={bits} cannot quantize this model's {what}: set KV_BITS=off to serve it"
    if not any(type(layer) in (KVCache, RotatingKVCache) for layer in layers):
        return None  # nothing per token to quantize (a model of linear attention only)
    if has_sinks(model):
        return (f"KV_BITS={bits} cannot quantize this model's attention with sinks (gpt-oss): mlx-lm's quantized "
                "attention does not take them; set KV_BITS=off to serve it")
    sizes = vector_sizes(model)
    if not sizes:
        return (f"KV_BITS={bits}: the length of this model's key and value vectors is not in its config "
                "(head_dim), so it cannot be quantized in groups; set KV_BITS=off to serve it")
    odd = {name: n for name, n in sizes.items() if n % group_size}
    if odd:
        name, n = next(iter(odd.items()))
        fits = [g for g in GROUP_SIZES if all(m % g == 0 for m in sizes.values())]
        fix = f"set KV_GROUP_SIZE={fits[-1]}" if fits else "set KV_BITS=off to serve it"
        return (f"KV_BITS={bits} with KV_GROUP_SIZE={group_size} cannot quantize this model's KV: its {name} of "
                f"{n} is not a multiple of {group_size}; {fix}")
    return None


def quantized(cache: list[Any], bits: int, group_size: int, latent: bool) -> list[Any]:
    """The fresh per-layer cache with every KVCache replaced by its quantized kind (CacheLists looked into)."""
    def convert(layer: Any) -> Any:
        if isinstance(layer, CacheList):
            return CacheList(*(convert(c) for c in layer.caches))
        if type(layer) is KVCache:
            return QuantizedLatent(group_size, bits) if latent else QuantizedKV(group_size, bits)
        if type(layer) is RotatingKVCache:
            return QuantizedRotating(layer.max_size, layer.keep, group_size, bits)
        return layer
    return [convert(c) for c in cache]


def install(model: Any, bits: int | None, group_size: int) -> None:
    """Make every cache built for model (mlx-lm's make_prompt_cache: the batch, the prefix cache, the KV
    measurement) quantized; raises KVQuantRefused where it cannot be. Nothing changes when bits is None."""
    why = refusal(model, bits, group_size)
    if why is not None:
        raise KVQuantRefused(why)
    if bits is None:
        return
    builder = model.make_cache if hasattr(model, "make_cache") else None
    latent = is_latent(model)

    def make_cache() -> list[Any]:
        fresh = builder() if builder is not None else [KVCache() for _ in model.layers]
        return quantized(fresh, bits, group_size, latent)

    model.make_cache = make_cache
