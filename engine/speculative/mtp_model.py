"""The target model with its multi-token-prediction heads (SPECULATIVE=mtp), as one model BatchGenerator drives.

Its cache list is the main model's caches, then one MTP KV cache per head depth, then a HiddenCarry
(engine/speculative/carry.py), so batching, the prefix cache and the disk tier handle them as any layer. Every
forward pass over tokens x_a..x_b also feeds the heads the pairs (h_{a-1}, x_a) .. (h_{b-1}, x_b) (h: the main
model's post-norm hidden, h_{a-1} from the carry; zero for a sequence's first token, as vLLM's deepseek_mtp.py
zeroes position 0), so the MTP cache gains as many entries as the main one and rolls back with it
(engine/speculative/rollback.py); the carry becomes h_b. After each step, `chain` drafts greedily from (carry,
next input) on every rank holding the heads (tensor parallel: every rank, their sharded layers meet in their
all_sums; pipeline: the last stage, rank 0, alone) and trims its own entries.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache, make_prompt_cache

from engine.mtp.heads import main_logits
from engine.speculative.carry import HiddenCarry


class MtpModel:
    """Looks like the mlx-lm model it wraps (attributes are the main model's) with the heads' caches added."""

    def __init__(self, main: Any, heads: Any, kv_bits: int | None = None, kv_group_size: int = 64) -> None:
        self.__dict__.update(main=main, heads=heads, layers_main=len(make_prompt_cache(main)), hidden=None,
                             kv=(kv_bits, kv_group_size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["main"], name)

    def make_cache(self) -> list:
        return [*make_prompt_cache(self.main), *self._heads_cache(), HiddenCarry()]

    def _heads_cache(self) -> list:
        """KV_BITS quantizes the heads' KV as the main layers' (same attention, same widths: the main model's
        check covers them), so they roll back, batch and get measured for the budget as those do."""
        bits, group_size = self.kv
        fresh = self.heads.make_cache()
        if bits is None:
            return fresh
        from engine.kvquant.kinds import is_latent, quantized

        return quantized(fresh, bits, group_size, is_latent(self.main))

    def split(self, cache: list) -> tuple[list, list, HiddenCarry]:
        n = self.layers_main
        return cache[:n], cache[n:-1], cache[-1]

    def __call__(self, inputs: mx.array, cache: list | None = None) -> mx.array:
        if cache is None:
            return self.main(inputs)
        main_cache, heads_cache, carry = self.split(cache)
        h = self.main.model(inputs, main_cache)
        previous = _carried(carry, h)
        self.heads(mx.concatenate([previous, h[:, :-1]], axis=1), inputs, heads_cache, depth=0)
        carry[0] = _last(carry, h, previous)
        self.__dict__["hidden"] = h
        return main_logits(self.main, h)

    def kept(self, cache: list, kept: list[int]) -> None:
        """After a verify pass: row i kept its fed input and kept[i] drafts, so its carry is the hidden there."""
        _, _, carry = self.split(cache)
        carry[0] = self.hidden[mx.arange(len(kept)), mx.array(kept)][:, None]

    def chain(self, cache: list, tokens: mx.array, k: int) -> mx.array:
        """(B, k) greedy drafts following each row's next input tokens (B,), the MTP cache left as it was."""
        _, heads_cache, carry = self.split(cache)
        h = carry[0]  # every decoding row has one: its prompt's forward passes set it
        t = tokens.reshape(-1, 1)
        drafts = []
        for _ in range(k):
            # chained depths all run the first layer: only its cache is fed by the main forward passes
            h, logits = self.heads(h, t, heads_cache, depth=0)
            t = mx.argmax(logits[:, -1:], axis=-1)
            drafts.append(t)
        out = mx.concatenate(drafts, axis=1)
        mx.eval(out)
        heads_cache[0].trim(k)
        return out


class StageModel:
    """An earlier pipeline stage beside the heads of the last (rank 0): the model as it is, its last cache made to
    depend on the final hidden state. The heads' KV depends on that state, so rank 0 runs the pipeline's closing
    all_gather whenever a prefill chunk's caches are evaluated; without the tie this stage would skip it there
    (only logits need it) and the ranks would wait on each other."""

    def __init__(self, main: Any) -> None:
        self.__dict__.update(main=main)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["main"], name)

    def make_cache(self) -> list:
        return make_prompt_cache(self.main)

    def __call__(self, inputs: mx.array, cache: list | None = None) -> mx.array:
        if cache is None:
            return self.main(inputs)
        h = self.main.model(inputs, cache)
        last = cache[-1]
        if isinstance(last, ArraysCache):  # as mlx-lm's qwen3_next ties a linear layer's state to its send
            last[0] = mx.depends(last[0], h)
        else:
            last.keys = mx.depends(last.keys, h)
        return main_logits(self.main, h)


def _carried(carry: HiddenCarry, h: mx.array) -> mx.array:
    """The carried hidden (B, 1, D): zeros for a batch none of whose rows has one yet (merging fills the others)."""
    if carry[0] is not None:
        return carry[0].astype(h.dtype)
    return mx.zeros((h.shape[0], 1, h.shape[-1]), h.dtype)


def _last(carry: HiddenCarry, h: mx.array, previous: mx.array) -> mx.array:
    """Each row's hidden at its last real position of this pass: a right-padded prefill chunk (carry.lengths
    counts each row's tokens left) ends shorter rows earlier, and a row with none left keeps its carry."""
    width = h.shape[1]
    if carry.lengths is None:
        return h[:, -1:]
    left = carry.lengths
    at = mx.clip(left - 1, 0, width - 1)
    picked = h[mx.arange(h.shape[0]), at][:, None]
    carry.lengths = left - width
    return mx.where((left > 0)[:, None, None], picked, previous)


def with_heads(loaded: Any, parallel_group: Any = None, kv_bits: int | None = None, kv_group_size: int = 64) -> Any:
    """The loaded model's model wrapped with the checkpoint's heads (ModelError where it ships none), the heads
    sharded as the main layers are under tensor parallel (parallel_group), else whole (one rank, or the last
    pipeline stage, which holds the final hidden state, the embedding and the lm_head they share); their KV stored
    in kv_bits (KV_BITS) as the main one."""
    from pathlib import Path

    from engine.mtp import load_heads

    heads = load_heads(loaded.model, Path(loaded.path))
    if parallel_group is not None:
        heads.shard(parallel_group)
    return MtpModel(loaded.model, heads, kv_bits, kv_group_size)
