"""Load MODEL on every rank: whole on one; on several, tensor slices or pipeline stages (engine/sharding.py).

Apart from engine/model.py, which sharding.py reads to resolve the folder, so that neither imports the other."""

from __future__ import annotations

import os

import mlx.core as mx
import msgspec

from config import Settings
from engine.facts import model_facts
from engine.kvquant.kinds import KVQuantRefused, install
from engine.mlx_compat import hf_tokenizer
from engine.model import (NO_TOKENIZER_LIMIT, LoadedModel, ModelError, context_length, load_errors_explained,
                          refuse_broken_folder, refuse_mismatched_weights, remote_code, resolve, vocab_size)
from engine.sharding import Layout, load_parallel
from engine.vision.load import image_hook


def load(settings: Settings, group: mx.distributed.Group | None) -> LoadedModel:
    """Load on every rank: whole on one, in the parallel mode engine.parallel chooses on several."""
    from mlx_lm import load as mlx_load

    from engine.parallel import SINGLE

    rank = group.rank() if group is not None else int(os.environ.get("MLX_RANK", "0") or 0)
    target = resolve(settings, rank)
    refuse_broken_folder(settings, target)
    with load_errors_explained(settings, target):
        refuse_mismatched_weights(settings, target, group)
        if group is not None and group.size() > 1:
            model, tokenizer, config, layout = load_parallel(settings, str(target), group)
        else:
            model, tokenizer, config = mlx_load(str(target), tokenizer_config=remote_code(settings),
                                                return_config=True, **remote_code(settings))
            layout = Layout(SINGLE)
    try:  # KV_BITS: every cache built for the model from here on is quantized, on every rank alike
        install(model, settings.kv_bits, settings.KV_GROUP_SIZE)
    except KVQuantRefused as exc:
        raise ModelError(str(exc)) from None
    # Rank 0 refuses a prompt longer than the context itself, with a 400 that says so. The tokenizer's own
    # check would log that running such a prompt "will result in indexing errors" when it never runs.
    hf_tokenizer(tokenizer).model_max_length = NO_TOKENIZER_LIMIT
    image_table = image_hook(model, config)
    facts = model_facts(target, config, tokenizer)
    if image_table is not None:
        facts = msgspec.structs.replace(facts, vision=True)
    return LoadedModel(image_table=image_table, config=config,model=model, tokenizer=tokenizer, path=str(target), context_length=context_length(config),
                       vocab_size=vocab_size(config) or len(tokenizer),
                       facts=facts, parallel=layout.mode,
                       pipeline_split=tuple(layout.split), parallel_note=layout.note)
