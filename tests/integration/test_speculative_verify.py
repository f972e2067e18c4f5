"""Drafts verified inside the batch step, on the zoo's tiny models: output, logprobs, stops and the prefix cache's
states are what plain decoding gives, whatever was proposed; correct drafts save forward passes."""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_lm import load

from engine.lockstep.batch import LockstepBatch
from engine.lockstep.plan import Insert, Plan
from engine.speculative.rollback import can_verify
from engine.zoo import ensure_zoo_model
from tests.harness import MODEL_CACHE

K = 4  # drafts per sequence and step


def loaded(name: str):
    return load(str(ensure_zoo_model(name, MODEL_CACHE)))


def prompts(n: int) -> list[list[int]]:
    """Prompts of different lengths, so the batch's rows are padded differently."""
    return [[(7 * i + 3 * j) % 61 + 3 for j in range(4 + 11 * i)] for i in range(n)]


def run(model, eos: set[int], inserts: list[Insert], drafter=None, grammars=None):
    """Decode inserts to the end; drafter(outputs) -> drafts per step. Returns the batch, each request's tokens,
    finish reasons, logprob rows, the decoding steps taken, and the drafts proposed and accepted."""
    batch = LockstepBatch(model, eos, 64, 8, grammars=grammars)
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=inserts))
    out = {ins.rid: [] for ins in inserts}
    reasons, rows, ended = {}, {ins.rid: [] for ins in inserts}, {}
    steps = proposed = accepted = 0
    while len(batch):
        res = batch.step(drafter(out) if drafter else None)
        assert not res.failed, res.failed
        steps += 1
        proposed += res.proposed
        accepted += res.accepted
        for rid, token, reason in res.tokens:
            out[rid].append(token)
            if reason:
                reasons[rid] = reason
        for rid, got in res.logprob_rows.items():
            rows[rid] += got
        ended.update(batch.ended)
    return dict(out=out, reasons=reasons, rows=rows, steps=steps, proposed=proposed, accepted=accepted,
                ended=ended)


def true_drafts(plain: dict[str, list[int]], corrupt=lambda rid, n: False, only=None):
    """Drafts from the plain run's continuation (tokens after the next input, which is out[rid][n]), with the
    positions corrupt(rid, index) says replaced by a wrong token, for the requests in `only` (all: None)."""

    def drafter(out):
        drafts = {}
        for rid, got in out.items():
            if only is not None and rid not in only:
                continue
            n = len(got)
            drafts[rid] = [(t + 1) % 97 if corrupt(rid, n + 1 + j) else t
                           for j, t in enumerate(plain[rid][n + 1:n + 1 + K])]
            drafts[rid] += [5] * (K - len(drafts[rid]))  # past the plain output's end: proposals all the same
        return drafts

    return drafter


@pytest.mark.parametrize("name", ["qwen3", "llama", "deepseek-v3", "qwen3-moe"])
def test_greedy_output_with_partly_wrong_drafts_is_the_plain_output(name):
    """Plain KV, MLA's latent and MoE models; rows of different lengths, one sequence without drafts, a stop token
    and max_tokens that fall inside accepted drafts, and the states kept for the prefix cache as plain decoding
    keeps them."""
    model, _ = loaded(name)
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=23 + 3 * i, keep=True, logprobs=True)
               for i, p in enumerate(prompts(4))]
    probe = run(model, set(), inserts)["out"]
    assert len({t for toks in probe.values() for t in toks}) > 5, "the model should not repeat one token"
    stop = probe["r1"][9]  # r1 stops at its tenth token (others may too, where they sample it)
    plain = run(model, {stop}, inserts)
    assert plain["reasons"]["r1"] == "stop" and "length" in plain["reasons"].values()
    wrong = lambda rid, at: (at + int(rid[1:])) % 3 == 0  # noqa: E731
    spec = run(model, {stop}, inserts, true_drafts(plain["out"], wrong, only={"r0", "r1", "r3"}))
    assert spec["out"] == plain["out"]
    assert spec["reasons"] == plain["reasons"]
    assert 0 < spec["accepted"] < spec["proposed"]
    assert spec["steps"] < plain["steps"]
    for rid in plain["out"]:
        cache, fed = spec["ended"][rid]
        plain_cache, plain_fed = plain["ended"][rid]
        assert fed == plain_fed
        assert [c.offset for c in cache] == [c.offset for c in plain_cache]
        assert mx.allclose(cache[0].keys[..., :fed, :], plain_cache[0].keys[..., :plain_fed, :], atol=1e-4)
        assert len(spec["rows"][rid]) == len(spec["out"][rid])
        for mine, theirs in zip(spec["rows"][rid], plain["rows"][rid]):
            assert mx.allclose(mine, theirs, atol=1e-4)


def test_drafts_equal_to_the_greedy_continuation_are_all_accepted_and_save_forward_passes(capsys):
    model, tok = loaded("qwen3")
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=60) for i, p in enumerate(prompts(3))]
    plain = run(model, set(), inserts)
    spec = run(model, set(), inserts, true_drafts(plain["out"]))
    assert spec["out"] == plain["out"]
    assert spec["accepted"] == spec["proposed"] > 0
    # one step prefills each prompt, then each step returns 1 + K tokens per sequence instead of 1
    tokens = sum(map(len, plain["out"].values()))
    with capsys.disabled():
        print(f"\nqwen3 zoo, 3 sequences, {tokens} tokens: batch steps plain {plain['steps']}, "
              f"with {K} perfect drafts {spec['steps']} ({plain['steps'] / spec['steps']:.2f}x fewer)")
    assert spec["steps"] * (K + 1) <= plain["steps"] + 2 * (K + 1)


@pytest.mark.parametrize("name", ["qwen3", "qwen3.5"])  # plain KV; linear attention's recorded states
def test_logprob_rows_and_sampled_output_are_reproducible_with_drafts(name):
    """A seeded sampled request gives the same tokens and rows with the same drafts, whatever shares its batch."""
    model, _ = loaded(name)
    ins = Insert(rid="s", tokens=prompts(2)[1], max_tokens=30, temperature=0.9, top_p=0.95, seed=7, logprobs=True)
    other = Insert(rid="o", tokens=prompts(1)[0], max_tokens=12, temperature=1.0, seed=3)
    drafter = lambda out: {rid: [(len(got) * 5 + j) % 40 for j in range(K)] for rid, got in out.items()}  # noqa
    alone = run(model, set(), [ins], drafter)
    shared = run(model, set(), [other, ins], drafter)
    assert alone["out"]["s"] == shared["out"]["s"]
    assert all(mx.array_equal(a, b) for a, b in zip(alone["rows"]["s"], shared["rows"]["s"]))
    # the seeded draws do not depend on the drafts: the plain answer proposed as drafts is kept and answered again
    plain = run(model, set(), [ins])
    right = run(model, set(), [ins], true_drafts(plain["out"]))
    assert right["out"] == plain["out"] and right["accepted"] > 0


def test_a_grammar_request_never_keeps_a_draft_its_grammar_forbids():
    from engine.decoding.constrained import Grammars

    model, tok = loaded("qwen3")
    grammars = Grammars(tok)
    grammar = grammars.json_grammar({"type": "array", "items": {"type": "integer"}, "maxItems": 6})
    eos = set(tok.eos_token_ids)
    inserts = [Insert(rid="g", tokens=prompts(2)[1], max_tokens=40, grammar=grammar)]
    plain = run(model, eos, inserts, grammars=grammars)
    forbidden = tok.encode("zz")[:1] * K  # never inside a JSON array of integers
    spec = run(model, eos, inserts, lambda out: {"g": forbidden}, grammars=grammars)
    assert spec["out"] == plain["out"]
    assert spec["accepted"] == 0 < spec["proposed"]
    right = run(model, eos, inserts, true_drafts(plain["out"]), grammars=grammars)
    assert right["out"] == plain["out"] and right["accepted"] > 0


def test_models_whose_caches_cannot_drop_a_suffix_decode_plainly_even_when_given_drafts():
    model, _ = loaded("gpt-oss")
    ok, why = can_verify(model)
    assert not ok and "cannot drop rejected drafts" in why
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=12) for i, p in enumerate(prompts(2))]
    plain = run(model, set(), inserts)
    spec = run(model, set(), inserts, lambda out: {rid: [1, 2, 3] for rid in out})
    assert spec["out"] == plain["out"] and spec["proposed"] == 0 and spec["steps"] == plain["steps"]


@pytest.mark.parametrize("name", ["qwen3", "llama", "deepseek-v3", "qwen3-moe"])
def test_plain_kv_and_latent_caches_can_verify(name):
    assert can_verify(loaded(name)[0]) == (True, "")


def test_penalties_and_bias_see_each_positions_own_context():
    """Repetition and presence penalties read the tokens before each position: with drafts (the fed input and the
    kept drafts in context, the rejected ones never) the output is plain decoding's."""
    model, _ = loaded("llama")
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=30, repetition_penalty=1.3, presence_penalty=0.4,
                      logit_bias={7: 2.0}) for i, p in enumerate(prompts(3))]
    plain = run(model, set(), inserts)
    spec = run(model, set(), inserts, true_drafts(plain["out"], lambda rid, at: at % 4 == 2))
    assert spec["out"] == plain["out"] and 0 < spec["accepted"] < spec["proposed"]


def test_a_request_whose_sampler_raises_in_a_speculative_step_fails_alone(monkeypatch):
    from engine.decoding import sampling

    monkeypatch.setattr(sampling, "_FAIL_SEED", 99)  # its sampler raises from its third token on
    model, _ = loaded("qwen3")
    good = Insert(rid="good", tokens=prompts(1)[0], max_tokens=20, temperature=0.8, seed=5)
    bad = Insert(rid="bad", tokens=prompts(2)[1], max_tokens=20, temperature=0.8, seed=99)
    drafter = lambda out: {rid: [3, 4, 5] for rid in out}  # noqa: E731
    alone = run(model, set(), [good], drafter)
    batch = LockstepBatch(model, set(), 64, 8)
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=[good, bad]))
    out, failed = [], {}
    while len(batch):
        res = batch.step(drafter({"good": out, "bad": []}))
        failed.update(res.failed)
        out += [t for rid, t, _ in res.tokens if rid == "good"]
    assert list(failed) == ["bad"] and "failpoint" in failed["bad"]
    assert out == alone["out"]["good"]


def test_drafts_with_token_ids_outside_the_vocabulary_are_cut_there():
    model, _ = loaded("qwen3")
    inserts = [Insert(rid="r", tokens=prompts(1)[0], max_tokens=12)]
    plain = run(model, set(), inserts)
    right = true_drafts(plain["out"])
    spec = run(model, set(), inserts, lambda out: {"r": right(out)["r"][:2] + [-1, 1 << 40, 3]})
    assert spec["out"] == plain["out"] and spec["accepted"] == spec["proposed"] > 0


def test_the_batch_kv_holds_no_more_positions_than_its_longest_sequence_whatever_each_row_accepts():
    """The KV budget reserves, per running sequence, the batch's longest sequence (every row padded to it). Rows
    that accept different numbers of drafts in turn (one all, the other none, then the other way round) must not
    leave the padding of their rejected drafts behind: the batch's buffer would grow by the most any row kept per
    step while each row grows by far less, past the memory the budget reserved."""
    model, _ = loaded("qwen3")
    inserts = [Insert(rid=f"r{i}", tokens=p, max_tokens=120) for i, p in enumerate(prompts(2))]
    plain = run(model, set(), inserts)["out"]
    wide = 16
    right = {rid: toks for rid, toks in plain.items()}
    batch = LockstepBatch(model, set(), 64, 8)
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=inserts))
    out = {ins.rid: [] for ins in inserts}
    step = 0
    while len(batch):
        good = f"r{step % 2}"  # the rows take turns accepting every draft
        drafts = {rid: (right[rid][len(got) + 1:len(got) + 1 + wide] if rid == good else [])
                  for rid, got in out.items()}
        drafts = {rid: d + [(d[-1] + 1) % 97 if d else 5] * (wide - len(d)) for rid, d in drafts.items()}
        drafts = {rid: d if rid == good else [(t + 1) % 97 for t in d] for rid, d in drafts.items()}
        for rid, token, _ in batch.step(drafts).tokens:
            out[rid].append(token)
        step += 1
        dec = batch.gen._generation_batch
        if dec.uids:
            longest = max(len(t) for t in dec.tokens)
            held = dec.prompt_cache[0]._idx
            assert held <= longest, f"step {step}: the batch KV holds {held} positions, its longest row {longest}"
    assert out == plain


def test_drafts_never_write_the_batch_kv_past_what_its_longest_sequence_reserved(monkeypatch):
    """The KV budget reserves each row of the batch its longest sequence's positions (prompt + max_tokens; the
    context limit caps the same sum). A row near its end gets no drafts, but the batch's forward pass is as wide as
    the most drafts any row has: the others' 16 drafts must not make the batch write past those positions."""
    from mlx_lm.models.cache import BatchKVCache

    written = []
    update = BatchKVCache.update_and_fetch

    def recording(self, keys, values):
        got = update(self, keys, values)
        written.append(self._idx)
        return got

    monkeypatch.setattr(BatchKVCache, "update_and_fetch", recording)
    model, _ = loaded("qwen3")
    long_prompt = [(5 * j) % 61 + 3 for j in range(240)]
    inserts = [Insert(rid="near", tokens=long_prompt, max_tokens=16),
               Insert(rid="far", tokens=prompts(1)[0], max_tokens=120)]
    reserved = max(len(ins.tokens) + ins.max_tokens for ins in inserts)
    batch = LockstepBatch(model, set(), 256, 8)
    batch.apply(Plan(step=0, fingerprint=0, token_check=0, inserts=inserts))
    out = {ins.rid: [] for ins in inserts}
    while "near" in batch.order:
        written.clear()
        for rid, token, _ in batch.step({"far": [1] * 16}).tokens:  # wrong drafts: "far" keeps proposing
            out[rid].append(token)
        assert max(written, default=0) <= reserved, f"after {len(out['near'])} tokens of the near-ended row"
    assert len(out["near"]) == 16
