"""Train a zoo model's MTP head briefly on the main model's own greedy continuations, so that drafts get accepted.

Random heads accept nothing. Here the head learns, offline and seeded, what the engine asks of it: the entry for
the pair (h_i, x_{i+1}) (h: the main model's post-norm hidden; the first entry all zeros, its embedding zeroed at
position 0) predicts x_{i+2}, attending causally over the earlier pairs, as engine/mtp's Heads runs it.
"""

from __future__ import annotations

from typing import Any

SEED = 38
PROMPTS, PROMPT_TOKENS, CONTINUATION = 32, 4, 40  # per batch of greedy continuations
HELD_OUT = 16
STEPS, LEARNING_RATE = 20, 3e-3  # held-out agreement levels off by then (70% at 20, 71% at 40)


def continuations(model: Any, prompts: Any, tokens: int) -> Any:
    """The prompts followed by `tokens` greedy tokens of `model` (one batch, a KV cache)."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    out = [prompts]
    logits = model(prompts, cache=cache)
    for _ in range(tokens):
        nxt = mx.argmax(logits[:, -1:], axis=-1)
        out.append(nxt)
        logits = model(nxt, cache=cache)
        mx.eval(logits)
    return mx.concatenate(out, axis=1)


def pairs(model: Any, sequences: Any) -> tuple[Any, Any, Any]:
    """(hidden, tokens, targets) in the engine's pairing: entry k takes (h_{k-1}, x_k) and predicts x_{k+1}."""
    import mlx.core as mx

    hidden = model.model(sequences)
    hidden = mx.concatenate([mx.zeros_like(hidden[:, :1]), hidden[:, :-2]], axis=1)
    return mx.stop_gradient(hidden), sequences[:, :-1], sequences[:, 1:]


def agreement(heads: Any, hidden: Any, tokens: Any, targets: Any) -> float:
    """Top-1 agreement of the head with the main model's next-next token over the greedy part."""
    import mlx.core as mx

    _, logits = heads(hidden, tokens)
    hits = (mx.argmax(logits, axis=-1) == targets)[:, PROMPT_TOKENS - 1:]
    return float(hits.astype(mx.float32).mean())


def trained(model: Any, cfg: dict, tensors: dict[str, Any], quiet_ids: list[int]) -> tuple[dict[str, Any], dict]:
    """The MTP tensors (checkpoint names) after training on `model`'s greedy continuations, seeded and offline;
    and the head's top-1 agreement with the model's next-next token on held-out prompts, before and after."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten

    from engine.mtp.heads import build_heads

    from engine.zoo import mtp_qwen

    text = cfg.get("text_config", cfg)  # Qwen3.5's language model
    qwen = cfg["model_type"] in mtp_qwen.FAMILIES  # its mtp.* stored as raw Hugging Face tensors
    heads = build_heads(model, cfg, tensors, text["num_hidden_layers"], zero_centred=qwen)
    model.freeze()
    allowed = np.setdiff1d(np.arange(text["vocab_size"]), np.array(quiet_ids))
    rng = np.random.default_rng(SEED)

    def data(count: int):
        prompts = mx.array(rng.choice(allowed, size=(count, PROMPT_TOKENS)))
        return pairs(model, continuations(model, prompts, CONTINUATION))

    train, held = data(PROMPTS), data(HELD_OUT)
    mx.eval(train, held)
    if "embed_tokens" in heads:
        heads.embed_tokens.freeze()  # the main model's embedding, copied

    def loss(module, hidden, tokens, targets):
        _, logits = module(hidden, tokens)
        losses = nn.losses.cross_entropy(logits, targets, reduction="none")
        return losses[:, PROMPT_TOKENS - 1:].mean()

    optimizer = optim.Adam(learning_rate=LEARNING_RATE)
    step = nn.value_and_grad(heads, loss)
    before = agreement(heads, *held)
    for _ in range(STEPS):
        _, grads = step(heads, *train)
        optimizer.update(heads, grads)
        mx.eval(heads.parameters(), optimizer.state)
    facts = {"held_out_agreement_before": round(before, 4), "held_out_agreement": round(agreement(heads, *held), 4)}
    params = dict(tree_flatten(heads.parameters()))
    return (to_qwen_checkpoint(params, cfg) if qwen else to_checkpoint(params, cfg)), facts


def to_qwen_checkpoint(params: dict[str, Any], cfg: dict) -> dict[str, Any]:
    """Qwen heads' parameters back under mtp.* in raw Hugging Face form (engine/zoo/mtp_qwen.py)."""
    from engine.zoo.mtp_qwen import raw

    named = {}
    for name, value in params.items():
        name = name.removeprefix("layers.0.")
        named["mtp." + (name.replace("mtp_block.", "layers.0.") if name.startswith("mtp_block.") else name)] = value
    return raw(named, cfg["model_type"])


def to_checkpoint(params: dict[str, Any], cfg: dict) -> dict[str, Any]:
    """Heads' parameters back under the checkpoint's names (engine/zoo/mtp.py's layout): the inverse of what
    load_heads does (experts unstacked, MLA's embed_q and unembed_out joined into kv_b_proj)."""
    import mlx.core as mx

    prefix = f"model.layers.{cfg['num_hidden_layers']}."
    out = {}
    for name, value in params.items():
        name = name.removeprefix("layers.0.").replace("mtp_block.", "")
        if ".switch_mlp." in name:
            for e in range(value.shape[0]):
                out[prefix + name.replace(".switch_mlp.", f".experts.{e}.")] = value[e]
        elif name.endswith("self_attn.embed_q.weight"):  # (heads, latent, nope) and (heads, v, latent)
            wv = params["layers.0.mtp_block." + name.replace("embed_q", "unembed_out")]
            joined = mx.concatenate([value.swapaxes(-1, -2), wv], axis=1)
            out[prefix + name.replace("embed_q", "kv_b_proj")] = joined.reshape(-1, joined.shape[-1])
        elif not name.endswith("self_attn.unembed_out.weight"):
            out[prefix + name] = value
    return out
