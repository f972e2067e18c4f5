"""Which multi-token-prediction weights a checkpoint holds, read from its files alone (no MLX).

mlx-lm's sanitize() drops these names while loading; they stay in the folder's safetensors, where this module
finds them from the headers (the index's weight_map where there is one, else every *.safetensors file: a zoo
model keeps its heads in a file of their own, see engine/zoo/mtp.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from config.model_folder import INDEX, architecture, mlx_lm_architectures

# mlx-lm module -> how the checkpoint names its MTP layers: "nextn" = model.layers.<num_hidden_layers + j>.*
# (vLLM's deepseek_mtp.py, glm4_moe_mtp.py), "mtp" = mtp.* (vLLM's qwen3_next_mtp.py).
NAMING = {"deepseek_v3": "nextn", "glm4_moe": "nextn", "qwen3_next": "mtp", "qwen3_5": "mtp", "qwen3_5_moe": "mtp"}


class Checkpoint:
    """A model folder's config and the tensor names of its MTP layers, with the files that hold them."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        config = json.loads((self.folder / "config.json").read_text())
        self.config = config
        self.text = config.get("text_config") or config  # a vision-language checkpoint's language model
        known = mlx_lm_architectures()
        self.family = architecture(config, *known[1:]) if known else str(config.get("model_type", ""))
        self.layers = int(self.text.get("num_hidden_layers") or 0)
        self.names = _tensor_names(self.folder)  # name -> file
        self.prefix = "mtp." if NAMING.get(self.family) == "mtp" else f"model.layers.{self.layers}."

    def head_names(self) -> dict[str, str]:
        """The MTP tensors (name -> file) under this family's naming."""
        if NAMING.get(self.family) == "mtp":
            return {n: f for n, f in self.names.items() if n.startswith("mtp.")}
        return {n: f for n, f in self.names.items() if (depth := nextn_depth(n, self.layers)) is not None
                and depth >= 0}

    def depths(self) -> list[int]:
        """The MTP layers found, as offsets past the last main layer (nextn) or mtp.layers indices."""
        if NAMING.get(self.family) == "mtp":
            return sorted({int(n.split(".")[2]) for n in self.head_names() if n.startswith("mtp.layers.")})
        return sorted({nextn_depth(n, self.layers) for n in self.head_names()})

    def refusal(self) -> str | None:
        """One sentence saying why SPECULATIVE=mtp cannot run on this checkpoint, derived from its weights."""
        where = f"MODEL={self.folder} ({self.family or 'unknown architecture'})"
        if self.family not in NAMING:
            others = sorted(n for n in self.names if "mtp" in n or "nextn" in n)
            held = f"its checkpoint holds {len(others)} tensor(s) like {others[0]}, but " if others else ""
            return (f"SPECULATIVE=mtp cannot run on {where}: {held}no multi-token-prediction module here follows "
                    f"this architecture (covered: {', '.join(sorted(NAMING))}); use SPECULATIVE=ngram or draft")
        if self.depths():
            return None
        why = (" (mlx_lm.convert drops the heads when it quantizes: convert the original checkpoint again "
               "keeping them, or use SPECULATIVE=ngram or draft)" if "quantization" in self.config
               else "; use SPECULATIVE=ngram or draft")
        return (f"SPECULATIVE=mtp cannot run on {where}: its checkpoint holds no weights under {self.prefix}*, "
                f"where this architecture keeps its multi-token-prediction layers{why}")


def nextn_depth(name: str, layers: int) -> int | None:
    """j for a tensor of model.layers.<layers + j>, None for every other name (main layers give j < 0)."""
    parts = name.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2]) - layers
    return None


def _tensor_names(folder: Path) -> dict[str, str]:
    """Every tensor name of the folder's safetensors, with its file: from the index where there is one."""
    index = folder / INDEX
    names: dict[str, str] = {}
    if index.is_file():
        names.update(json.loads(index.read_text()).get("weight_map", {}))
    indexed = set(names.values())
    for path in sorted(folder.glob("*.safetensors")):
        if path.name not in indexed:
            names.update({name: path.name for name in _header(path)})
    return names


def _header(path: Path) -> list[str]:
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        return [k for k in json.loads(f.read(length)) if k != "__metadata__"]


def heads_refusal(folder: Path) -> str | None:
    """None when the folder's checkpoint ships MTP layers of a covered family; else one sentence saying why not."""
    try:
        return Checkpoint(Path(folder)).refusal()
    except (OSError, ValueError, AttributeError, TypeError):
        return None  # the model's own checks (config/model_folder.py) say what is wrong with the folder
