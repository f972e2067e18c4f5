"""How the KV cache stores keys and values (KV_BITS, KV_GROUP_SIZE): in words for people, in bytes for the budget.

No MLX here. With KV_BITS set, keys and values are stored as mlx-lm's QuantizedKVCache stores them (mx.quantize):
a row of head_dim numbers becomes head_dim x bits / 8 bytes of packed integers plus one scale and one bias per
group of KV_GROUP_SIZE, both in the model's float type. At bf16 and group 64 a row takes 0.53x its float size at
8 bits and 0.28x at 4 bits; at float32 the packed part is the same and the ratio halves again.
"""

from __future__ import annotations

# the float types' short names, as mlx, torch and config.json spell them (the last dotted part)
SHORT_NAMES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def dtype_name(dtype: str) -> str:
    """"bf16" for "bfloat16", "mlx.core.bfloat16" or "torch.bfloat16"; an unknown type's own last name."""
    base = str(dtype).rsplit(".", 1)[-1]
    return SHORT_NAMES.get(base, base)


def label(bits: int | None, group_size: int, dtype: str) -> str:
    """The KV precision for people: the float type the model computes in ("bf16") or "8-bit, group 64"."""
    if bits is None:
        return dtype_name(dtype) or "float"  # a config that names no type: MLX's half precision, unnamed
    return f"{bits}-bit, group {group_size}"


def row_bytes(dim: int, dtype_bytes: int, bits: int | None, group_size: int) -> int:
    """Bytes one row of dim keys (or values) takes: in float, or packed in bits with a scale and a bias per group
    (a group that does not divide dim is rounded up: mx.quantize refuses such rows, so this only bounds them)."""
    if bits is None:
        return dim * dtype_bytes
    return -(-dim * bits // 8) + 2 * -(-dim // group_size) * dtype_bytes
