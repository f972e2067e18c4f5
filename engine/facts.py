"""What the loaded model is, from its folder, config and tokenizer: no MLX, read once at load.

The parameter count comes from the safetensors headers (8-byte length, then JSON naming each
tensor's dtype and shape), so it is the whole model's whatever shard this rank holds; MLX packs
quantized weights into uint32 words, which are unpacked here by their bits.
"""

from __future__ import annotations

import json
import logging
import math
import struct
from pathlib import Path
from typing import Any

from ipc.messages import ModelFacts

log = logging.getLogger(__name__)

# a safetensors header past this is not one (real ones are a few MB at most)
MAX_HEADER_BYTES = 100 * 2**20
_INT64 = 2**63


def model_facts(folder: Path | None, config: dict[str, Any], tokenizer: Any) -> ModelFacts:
    """The facts of the model in folder (None: its files are not at hand; only config and tokenizer count)."""
    quant = config.get("quantization") or config.get("quantization_config") or {}
    quant = quant if isinstance(quant, dict) else {}
    bits = quant.get("bits") if isinstance(quant.get("bits"), int) else 0
    parameters, weight_bytes = 0, 0
    if folder is not None:
        files = sorted(folder.glob("*.safetensors"))
        try:
            weight_bytes = sum(f.stat().st_size for f in files)
            parameters = count_parameters(files, quant)
        except (OSError, ValueError) as exc:
            log.warning("cannot count the parameters of %s: %s", folder, exc)
    template = getattr(tokenizer, "chat_template", None)
    return ModelFacts(
        architecture=architecture(config),
        parameters=parameters,
        weight_bytes=weight_bytes,
        quantization_bits=bits,
        quantization_mode=str(quant.get("mode", "affine")) if bits else "",
        dtype=str(_text_value(config, "torch_dtype") or _text_value(config, "dtype") or ""),
        config=scalars(config),
        chat_template=template if isinstance(template, str) else "",
        thinking=bool(getattr(tokenizer, "has_thinking", False)),
        tool_calling=bool(getattr(tokenizer, "has_tool_calling", False)),
    )


def architecture(config: dict[str, Any]) -> str:
    """config's model_type, else its first architecture class without the HF suffix ("LlamaForCausalLM": llama)."""
    name = _text_value(config, "model_type")
    if isinstance(name, str) and name:
        return name
    classes = config.get("architectures") or []
    if classes and isinstance(classes[0], str):
        return classes[0].lower().removesuffix("forcausallm").removesuffix("forconditionalgeneration")
    return ""


def scalars(config: dict[str, Any]) -> dict[str, int | float | str | bool]:
    """The config's top-level scalars; a multimodal model's text_config fills in what the top lacks."""
    out: dict[str, int | float | str | bool] = {}
    text = config.get("text_config")
    for source in (config, text if isinstance(text, dict) else {}):
        for key, value in source.items():
            if key in out or not isinstance(key, str):
                continue
            if isinstance(value, bool | str) or (isinstance(value, int) and -_INT64 <= value < _INT64):
                out[key] = value
            elif isinstance(value, float) and math.isfinite(value):
                out[key] = value
    return out


def count_parameters(files: list[Path], quant: dict[str, Any]) -> int:
    """Every tensor's elements, a quantized weight's unpacked (its scales and biases are not parameters)."""
    tensors: dict[str, tuple[str, list[int]]] = {}
    for f in files:
        tensors.update(read_header(f))
    total = 0
    for name, (dtype, shape) in tensors.items():
        base, _, kind = name.rpartition(".")
        packed = tensors.get(base + ".weight", ("", []))[0] == "U32" and base + ".scales" in tensors
        if packed and kind in ("scales", "biases"):
            continue
        count = math.prod(shape)
        if packed and kind == "weight":
            count = count * 32 // _bits_of(base, quant)
        total += count
    return total


def _bits_of(layer: str, quant: dict[str, Any]) -> int:
    """A layer's own bits (mlx-lm's mixed quantization) or the model's."""
    own = quant.get(layer)
    bits = own.get("bits") if isinstance(own, dict) else quant.get("bits")
    if not isinstance(bits, int) or not 1 <= bits <= 16:
        raise ValueError(f"no quantization bits for {layer}")
    return bits


def read_header(path: Path) -> dict[str, tuple[str, list[int]]]:
    """name -> (dtype, shape) of each tensor in one safetensors file."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path.name} is not a safetensors file")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER_BYTES:
            raise ValueError(f"{path.name} has a {size}-byte header: not a safetensors file")
        header = json.loads(f.read(size))
    if not isinstance(header, dict):
        raise ValueError(f"{path.name} has no tensor table")
    out = {}
    for name, entry in header.items():
        if name == "__metadata__" or not isinstance(entry, dict):
            continue
        shape = entry.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{path.name}: tensor {name} has no valid shape")
        out[name] = (str(entry.get("dtype", "")), shape)
    return out


def _text_value(config: dict[str, Any], key: str) -> Any:
    text = config.get("text_config")
    return config.get(key) or (text.get(key) if isinstance(text, dict) else None)
