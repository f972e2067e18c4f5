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
STEPS, LEARNING_RATE = 40, 3e-3


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


def trained(model: Any, cfg: dict, tensors: dict[str, Any], quiet_ids: list[int]) -> dict[str, Any]:
    """The MTP tensors (checkpoint names) after training on `model`'s greedy continuations; seeded, offline."""
    import mlx.core as mx
    import mlx.nn as nn
    import mlx.optimizers as optim
    import numpy as np
    from mlx.utils import tree_flatten

    from engine.mtp.heads import build_heads

    heads = build_heads(model, cfg, tensors, cfg["num_hidden_layers"])
    model.freeze()
    allowed = np.setdiff1d(np.arange(cfg["vocab_size"]), np.array(quiet_ids))
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
    for i in range(STEPS):
        value, grads = step(heads, *train)
        optimizer.update(heads, grads)
        mx.eval(heads.parameters(), optimizer.state)
        if i % 10 == 0:
            print(i, float(value), agreement(heads, *train), agreement(heads, *held))
    print("before", before, "after", agreement(heads, *held))
    return dict(tree_flatten(heads.parameters()))
