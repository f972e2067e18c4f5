"""Deterministic, offline demo models: tiny random-weight Qwen3 checkpoints that mlx-lm loads.

The server needs a model that exists without a network or a model hub: the default model of a
fresh install, and the model every test uses. This package writes one from nothing but code and
the two data files of engine/modelgen (the floor it shares with engine/zoo):

- a byte-level BPE tokenizer trained with `tokenizers` on corpus.txt (English prose, JSON and
  tool-call snippets), with Qwen's ChatML special tokens and chat_template.jinja (Qwen3-style);
- random weights for mlx-lm's `qwen3` architecture, drawn from numpy's PCG64 with a fixed seed.

Every file is a pure function of this package and engine/modelgen, so each Mac of a cluster can
generate its own copy and all ranks hold bit-identical weights without copying anything. The text
the models write is gibberish by construction.

Sizes (`DEMO_MODELS`): "tiny" (about 0.2M parameters, vocab 1024; the default, for tests) and
"small" (about 10M parameters, vocab 4096; for benchmarks). Head counts and the MLP width divide
by 4, so 2- and 4-way tensor parallelism (`mlx_lm.utils.sharded_load`) works. Both take 131072
tokens of context, so agent-sized prompts fit.

    python -m engine.demo [--size tiny|small] [--cache-dir DIR]   # prints the model's path
"""

from engine.demo.specs import DEMO_MODELS
from engine.demo.store import MARKER_FILE, VERSION, demo_model_path, ensure_demo_model
from engine.modelgen.store import DEFAULT_CACHE_DIR

__all__ = ["DEFAULT_CACHE_DIR", "DEMO_MODELS", "MARKER_FILE", "VERSION", "demo_model_path", "ensure_demo_model"]
