"""mlx-lm's vision-language wrappers hold a text model that shards (Llama, Ministral 3, Qwen3; Gemma 3 with
engine/shard_gemma3.py) but have no shard() of their own, so sharded_load would refuse tensor parallelism; theirs is
the text model's."""

from __future__ import annotations

import importlib

# wrapper modules of mlx_lm.models whose Model keeps the text model in .language_model
WRAPPERS = ("mistral3", "qwen3_vl", "gemma3", "qwen2_vl")


def _shard(self, group=None):
    return self.language_model.shard(group)


def delegate_shard() -> None:
    """Give each wrapper class a shard() calling its text model's (where that one has one)."""
    from engine.shard_gemma3 import install

    install()
    for name in WRAPPERS:
        cls = importlib.import_module(f"mlx_lm.models.{name}").Model
        if "shard" not in cls.__dict__:
            cls.shard = _shard
