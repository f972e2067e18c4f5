"""engine/facts.py: what /api/show says about the model, from safetensors headers, config and tokenizer (no MLX)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.facts import architecture, model_facts, read_header, scalars


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], padding: int = 0) -> None:
    """A safetensors file whose header names these tensors (the data is zeros: only the header is read)."""
    header = {"__metadata__": {"format": "mlx"}}
    header.update({name: {"dtype": dtype, "shape": shape, "data_offsets": [0, 0]} for name, (dtype, shape) in
                   tensors.items()})
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(padding))


TOKENIZER = SimpleNamespace(chat_template="{{ messages }}", has_thinking=True, has_tool_calling=False)


def test_a_quantized_model_counts_its_unpacked_weights(tmp_path):
    # a 4-bit 64x128 projection packs 8 values per uint32; one layer was kept at 8 bits
    write_safetensors(tmp_path / "model-00001-of-00002.safetensors", {
        "model.layers.0.q.weight": ("U32", [64, 16]),
        "model.layers.0.q.scales": ("BF16", [64, 2]),
        "model.layers.0.q.biases": ("BF16", [64, 2]),
        "model.norm.weight": ("BF16", [128]),
    }, padding=100)
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {
        "lm_head.weight": ("U32", [10, 32]),
        "lm_head.scales": ("BF16", [10, 2]),
        "lm_head.biases": ("BF16", [10, 2]),
        "lm_head.bias": ("BF16", [10]),
    })
    config = {"model_type": "qwen3", "hidden_size": 128, "torch_dtype": "bfloat16", "rope_scaling": None,
              "quantization": {"group_size": 64, "bits": 4, "mode": "affine", "lm_head": {"bits": 8}}}
    facts = model_facts(tmp_path, config, TOKENIZER)
    assert facts.parameters == 64 * 128 + 128 + 10 * 128 + 10
    assert facts.weight_bytes == sum(f.stat().st_size for f in tmp_path.iterdir())
    assert (facts.architecture, facts.quantization_bits, facts.quantization_mode, facts.dtype) == \
        ("qwen3", 4, "affine", "bfloat16")
    assert facts.config == {"model_type": "qwen3", "hidden_size": 128, "torch_dtype": "bfloat16"}
    assert (facts.chat_template, facts.thinking, facts.tool_calling) == ("{{ messages }}", True, False)


def test_without_files_only_the_config_and_tokenizer_count():
    facts = model_facts(None, {"architectures": ["LlamaForCausalLM"]}, SimpleNamespace())
    assert facts.architecture == "llama" and facts.parameters == facts.weight_bytes == 0
    assert facts.chat_template == "" and not facts.thinking and not facts.tool_calling


def test_an_unreadable_header_leaves_the_count_unknown(tmp_path, caplog):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 2**40))
    facts = model_facts(tmp_path, {"model_type": "qwen3"}, TOKENIZER)
    assert facts.parameters == 0 and facts.weight_bytes == 8
    assert "cannot count the parameters" in caplog.text


@pytest.mark.parametrize("entry", [{"dtype": "F32"}, {"dtype": "F32", "shape": [-1]}, {"dtype": "F32", "shape": "x"}])
def test_a_tensor_without_a_valid_shape_is_refused(tmp_path, entry):
    raw = json.dumps({"w": entry}).encode()
    (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw)
    with pytest.raises(ValueError, match="shape"):
        read_header(tmp_path / "m.safetensors")


def test_a_multimodal_config_reads_its_text_config():
    config = {"architectures": ["Gemma3ForConditionalGeneration"], "text_config": {
        "model_type": "gemma3_text", "hidden_size": 2560, "max_position_embeddings": 131072, "big": 2**70,
        "nan": float("nan"), "layers": [1]}}
    assert architecture(config) == "gemma3_text"
    assert scalars(config) == {"model_type": "gemma3_text", "hidden_size": 2560, "max_position_embeddings": 131072}
