"""The lockstep batch on the real demo model: plans apply identically, divergence fails fast."""

from __future__ import annotations

import pytest
from mlx_lm import load

from config import load_settings
from engine.lockstep.batch import DesyncError, LockstepBatch
from engine.lockstep.plan import Insert, Plan
from engine.model import resolve
from tests.harness import MODEL_CACHE


@pytest.fixture(scope="module")
def model():
    settings = load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE)}, env_file="/dev/null")
    m, tok = load(str(resolve(settings)))
    return m, set(tok.eos_token_ids)


def plan(step: int, batch: LockstepBatch, **kw) -> Plan:
    return Plan(step=step, fingerprint=batch.fingerprint(step), token_check=batch.last_check, **kw)


def test_two_batches_fed_the_same_plans_stay_identical_and_verify(model):
    a, b = (LockstepBatch(model[0], model[1], 64, 8) for _ in range(2))
    inserts = [Insert(rid=f"r{i}", tokens=[10 + i] * (5 + 7 * i), max_tokens=12, temperature=0.8, seed=i)
               for i in range(3)]
    outs = {id(a): [], id(b): []}
    for step in range(20):
        p = plan(step, a, inserts=inserts if step == 0 else [], removes=["r1"] if step == 5 else [])
        b.verify(p, rank=1)
        for batch in (a, b):
            batch.apply(p)
            outs[id(batch)].append(batch.step())
    assert outs[id(a)] == outs[id(b)]
    assert any(outs[id(a)])


def test_a_follower_with_another_batch_fails_fast_naming_the_step(model):
    lead, follower = (LockstepBatch(model[0], model[1], 64, 8) for _ in range(2))
    lead.apply(plan(0, lead, inserts=[Insert(rid="only-on-rank-0", tokens=[5, 6, 7], max_tokens=4)]))
    with pytest.raises(DesyncError, match=r"fingerprint .* at step 1"):
        follower.verify(plan(1, lead), rank=1)


def test_a_follower_that_sampled_other_tokens_fails_fast(model):
    lead, follower = (LockstepBatch(model[0], model[1], 64, 8) for _ in range(2))
    first = plan(0, lead, inserts=[Insert(rid="r", tokens=[5, 6, 7], max_tokens=8)])
    for batch in (lead, follower):
        batch.apply(first)
        batch.step()
        batch.step()
    follower.last_check ^= 1  # as if this rank had sampled a different token
    with pytest.raises(DesyncError, match="sampled tokens differ"):
        follower.verify(plan(1, lead), rank=1)


def test_an_idle_plan_lets_go_of_every_state_held_for_a_store_that_never_came(model):
    """States kept for rank 0's stores (a sequence's cache as it ended, a prompt's end) wait a few plans; once the
    engine is idle no store can come, and holding them would keep memory the prefix cache does not count."""
    import gc

    import mlx.core as mx

    batch = LockstepBatch(model[0], model[1], 512, 8)
    gc.collect()
    base = mx.get_active_memory()
    batch.apply(plan(0, batch, inserts=[Insert(rid=f"r{i}", tokens=[7 + i] * 400, max_tokens=1, keep=True,
                                              keep_prompt=True) for i in range(4)]))
    step = 1
    while len(batch):
        batch.step()
        batch.apply(plan(step, batch))  # rank 0 stores none of them (as when an entry already covers a prompt)
        step += 1
    gc.collect()
    assert mx.get_active_memory() > base + (1 << 20), "the ended sequences' states should still be held here"
    batch.apply(plan(step, batch, idle=True))
    gc.collect()
    assert mx.get_active_memory() <= base + (64 << 10)
