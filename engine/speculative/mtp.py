"""The mtp proposer: the target's own multi-token-prediction heads, where mlx-lm keeps them; else a refusal at start.

What mlx-lm 0.32.2 does with the heads checkpoints ship (read from each model's `sanitize()`): every family below
discards them while loading, and no model class builds an MTP module, so no architecture can run them yet.
SPECULATIVE=mtp is therefore refused at start with one sentence saying so; SPECULATIVE=ngram or draft works on
every trimmable model. A family whose heads mlx-lm keeps gets its proposer here: it proposes from the target's
hidden state at the last position, which the verify step would hand over with each step's results.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from config import Settings
from engine.model import LoadedModel, ModelError

# mlx-lm module (= model_type) -> the weights its sanitize() drops: the families whose checkpoints ship MTP heads.
DROPPED_HEADS = {
    "deepseek_v3": "model.layers.61",
    "deepseek_v32": "model.layers.<num_hidden_layers>+",
    "deepseek_v41": "mtp.*",
    "glm4_moe": "model.layers.<num_hidden_layers>",
    "glm4_moe_lite": "model.layers.<num_hidden_layers>+",
    "glm_moe_dsa": "model.layers.<num_hidden_layers>+",
    "qwen3_next": "mtp.*",
    "qwen3_5": "mtp.*",
    "qwen3_5_moe": "mtp.*",
    "mimo": "model.mtp_layers.*",
    "mimo_v2_flash": "model.mtp*",
    "step3p5": "*.mtp* and model.layers.<num_hidden_layers>+",
    "longcat_flash": "model.mtp*",
    "ernie4_5_moe": "mtp_block.*, mtp_linear_proj.*",
    "kimi_linear": "model.mtp*",
    "kimi_k3": "model.mtp*, mtp*",
    "nemotron_h": "mtp.*",
    "bailing_hybrid": "model.layers.<num_hidden_layers>+",
    "bailing_moe_v3": "model.layers.<num_hidden_layers>+",
    "exaone_moe": "mtp.*",
}
# Families whose heads mlx-lm keeps and this package can run: none in mlx-lm 0.32.2.
RUNNABLE: dict[str, type] = {}
ALTERNATIVE = "use SPECULATIVE=ngram, or SPECULATIVE=draft with a small DRAFT_MODEL of the same tokenizer"


def mtp_support(loaded: LoadedModel, name: str = "") -> str | None:
    """None when SPECULATIVE=mtp can run on this model; else one sentence saying why not and what to use."""
    family = _family(loaded.model)
    heads = shipped_heads(Path(loaded.path))
    model = f"MODEL={name or loaded.path} ({family})"
    if family in RUNNABLE and heads and _kept_heads(loaded.model):
        return None
    how = f" (its sanitize() drops {DROPPED_HEADS.get(family)} at load and at mlx_lm.convert)"
    return _why_not(model, family, heads, how)


def mtp_refusal(folder: Path) -> str | None:
    """The same verdict from the model's files alone (`launch.sh check` and start, before any weight loads): its
    config.json's model_type stands for mlx-lm's module; None when SPECULATIVE=mtp can run."""
    try:
        family = str(json.loads((Path(folder) / "config.json").read_text()).get("model_type", ""))
    except (OSError, ValueError, AttributeError):
        return None  # the model's own checks say what is wrong with the folder
    heads = shipped_heads(Path(folder))
    model = f"MODEL={folder} ({family or 'unknown architecture'})"
    if family in RUNNABLE and heads:
        return None
    return _why_not(model, family, heads, " at load")


def _why_not(model: str, family: str, heads: int, how: str) -> str:
    """The sentence refusing SPECULATIVE=mtp on `model` (of mlx-lm's `family`), whose checkpoint ships `heads`
    MTP layers; `how` says how mlx-lm drops them: in more detail where the loaded model shows it."""
    import mlx_lm

    if not heads:
        return (f"SPECULATIVE=mtp cannot run on {model}: its checkpoint ships no multi-token-prediction heads "
                f"(config.json declares none); {ALTERNATIVE}")
    if family in DROPPED_HEADS:
        return (f"SPECULATIVE=mtp cannot run on {model}: mlx-lm {mlx_lm.__version__} drops the checkpoint's "
                f"{heads} multi-token-prediction layer(s){how} and runs them for no architecture; {ALTERNATIVE}")
    return (f"SPECULATIVE=mtp cannot run on {model}: mlx-lm {mlx_lm.__version__} has no multi-token-prediction "
            f"module for this architecture; {ALTERNATIVE}")


def shipped_heads(folder: Path) -> int:
    """How many MTP layers the checkpoint's config.json declares (num_nextn_predict_layers, mtp_num_hidden_layers
    and their kin, at the top or in text_config)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    found = 0
    for part in (config, config.get("text_config") or {}):
        for key, value in part.items():
            if ("nextn" in key or "mtp" in key) and isinstance(value, int) and not isinstance(value, bool):
                found = max(found, value)
    return found


def _family(model: Any) -> str:
    """mlx-lm's module for the model (its model_type after mlx-lm's own remapping)."""
    return type(model).__module__.rsplit(".", 1)[-1]


def _kept_heads(model: Any) -> bool:
    from mlx.utils import tree_flatten

    return any("mtp" in path for path, _ in tree_flatten(model.parameters()))


class MtpProposer:
    """Refuses at start where mlx-lm cannot run the heads (every architecture in mlx-lm 0.32.2)."""

    def __init__(self, settings: Settings, loaded: LoadedModel) -> None:
        problem = mtp_support(loaded, settings.MODEL)
        if problem is not None:
            raise ModelError(problem)
        self.proposer = RUNNABLE[_family(loaded.model)](settings, loaded)

    def propose(self, histories: dict[str, list[int]], k: int) -> dict[str, list[int]]:
        return self.proposer.propose(histories, k)

    def forget(self, rid: str) -> None:
        self.proposer.forget(rid)
