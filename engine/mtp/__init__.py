"""Multi-token-prediction heads: the layers checkpoints ship for drafting, which mlx-lm 0.32.2 drops at load.

    from engine.mtp import Heads, heads_refusal, load_heads

Covered families (engine/mtp/files.py NAMING), each following vLLM's module for it: DeepSeek-V3 and GLM-4.x MoE
(engine/mtp/nextn.py), Qwen3-Next and Qwen3.5 (engine/mtp/qwen.py). `heads_refusal(folder)` is the verdict from the files alone; `load_heads(model, folder)`
raises the same sentence as a ModelError.
"""

from engine.mtp.files import heads_refusal
from engine.mtp.heads import Heads, load_heads

__all__ = ["Heads", "heads_refusal", "load_heads"]
