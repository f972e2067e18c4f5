"""engine/mlx_compat.py against the installed mlx-lm: each private internal it reaches still exists and means
what the engine assumes. An mlx-lm upgrade that moves one fails here first."""

from __future__ import annotations

import pytest
from mlx_lm import load
from mlx_lm.generate import BatchGenerator

from config import load_settings
from engine import mlx_compat
from engine.model import resolve
from tests.harness import MODEL_CACHE


@pytest.fixture(scope="module")
def loaded():
    settings = load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE)}, env_file="/dev/null")
    return load(str(resolve(settings)))


def test_batch_occupancy_follows_prompts_from_waiting_to_decoding(loaded):
    model, tok = loaded
    gen = BatchGenerator(model, stop_tokens=[[t] for t in sorted(tok.eos_token_ids)], completion_batch_size=4,
                         prefill_batch_size=4, prefill_step_size=16)
    assert mlx_compat.batch_occupancy(gen) == (0, 0, 0)
    gen.insert([[5, 6, 7], [8, 9, 10, 11]], max_tokens=[8, 8])
    assert mlx_compat.batch_occupancy(gen) == (0, 0, 2)
    for _ in range(3):
        gen.next()
    decoding, prefilling, waiting = mlx_compat.batch_occupancy(gen)
    assert (decoding, prefilling, waiting) == (2, 0, 0)
    # the batches' caches are all the KV mlx-lm itself counts (MAX_LIVE_BUFFERS counts their arrays)
    assert sum(c.nbytes for layers in mlx_compat.batch_caches(gen) for c in layers) == gen.prompt_cache_nbytes > 0
    mlx_compat.set_prefill_chunk(gen, 32)
    assert gen.prefill_step_size == 32
    gen.close()


def test_a_sequence_pauses_at_its_segments_ends_and_feeds_its_first_token_the_step_after_its_prompt(loaded):
    # the batch copies states at these counts (engine/lockstep/boundaries.py)
    model, tok = loaded
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=16)
    prompt = list(range(5, 45))
    (uid,) = gen.insert_segments([[prompt[:21], prompt[21:]]], max_tokens=[4])
    fed = []
    for _ in range(8):
        sampled = gen.next()[1]
        fed.append(mlx_compat.fed_tokens(gen)[uid])
        assert fed[-1] == len(gen.extract_cache([uid])[uid][1])
        if fed[-1] == len(prompt):
            assert not sampled  # its whole prompt fed, no token sampled yet
            break
    assert fed == [16, 21, 37, 39, 40]  # mlx-lm feeds the last prompt token apart, the step it decodes from
    _, (first,) = gen.next()  # the next step feeds the first sampled token
    assert mlx_compat.fed_tokens(gen)[uid] == len(prompt) + 1 and first.finish_reason is None
    gen.close()


def test_decoding_histories_are_the_fed_tokens_then_the_next_input(loaded):
    """A proposer continues [prompt, tokens reported so far, the token the next step feeds]: mlx-lm reports a
    token the step after sampling it, so the history's last token is the one the next step reports."""
    model, tok = loaded
    gen = BatchGenerator(model, stop_tokens=[[t] for t in sorted(tok.eos_token_ids)], completion_batch_size=4,
                         prefill_batch_size=4, prefill_step_size=16)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    uids = gen.insert(prompts, max_tokens=[20, 20])
    assert mlx_compat.decoding_histories(gen) == {}
    reported = {uid: [] for uid in uids}
    while len(mlx_compat.decoding_histories(gen)) < 2:  # both prompts fed
        for r in gen.next()[1]:
            reported[r.uid].append(r.token)
    for _ in range(4):
        before = mlx_compat.decoding_histories(gen)
        for r in gen.next()[1]:
            reported[r.uid].append(r.token)
            assert r.token == before[r.uid][-1]  # the next input, reported by this step
        for uid, prompt in zip(uids, prompts):
            history = mlx_compat.decoding_histories(gen)[uid]
            assert history[:-1] == prompt + reported[uid]
    gen.close()


def test_a_detokenizer_keeps_its_leading_space(loaded):
    _, tok = loaded
    ids = tok.encode(" hello", add_special_tokens=False)
    detok = tok.detokenizer
    mlx_compat.keep_leading_space(detok)
    for t in ids:
        detok.add_token(t)
    detok.finalize()
    assert detok.text == " hello"


def test_byte_level_pieces_decode_to_each_tokens_bytes(loaded):
    _, tok = loaded
    pieces = mlx_compat.byte_level_pieces(tok)
    table = mlx_compat.byte_decoder()
    assert pieces is not None and len(pieces) >= len(tok.get_vocab()) - 10
    (tid,) = tok.encode(" the", add_special_tokens=False)
    assert bytes(table[c] for c in pieces[tid]) == b" the"


def test_hf_tokenizer_is_the_wrapped_tokenizer(loaded):
    _, tok = loaded
    hf = mlx_compat.hf_tokenizer(tok)
    assert hf.encode("hi there", add_special_tokens=False) == tok.encode("hi there", add_special_tokens=False)


def test_a_local_model_folder_is_its_own_path_and_an_absent_repo_is_not_fetched(tmp_path, monkeypatch):
    settings = load_settings({"MODEL": "demo-tiny", "MODEL_CACHE_DIR": str(MODEL_CACHE)}, env_file="/dev/null")
    folder = resolve(settings)
    assert mlx_compat.local_model_path(str(folder)) == folder
    assert mlx_compat.local_model_path(str(folder), download=False) == folder
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(Exception, match="(?i)local|offline|cache|not found"):
        mlx_compat.local_model_path("nobody/absent-model", download=False)


def test_the_decoding_view_reads_the_lookahead_mlx_lm_keeps_and_a_replaced_step_still_prefills(loaded):
    """The speculative step (engine/speculative/verify.py) relies on each of these: the next input sampled one step
    ahead with its row, the fed tokens, the counts max_tokens and stop tokens end a sequence by, and a step whose
    decoding half is replaced still moves prompts along."""
    model, tok = loaded
    gen = BatchGenerator(model, stop_tokens=[[9999]], completion_batch_size=4, prefill_batch_size=4)
    gen.insert([[5, 6, 7], [8, 9, 10, 11]], max_tokens=[3, 8])
    while mlx_compat.batch_occupancy(gen)[0] < 2:
        gen.next()
    dec = mlx_compat.Decoding(mlx_compat.decoding_batch(gen))
    pending, rows = dec.pending()
    assert len(pending) == len(rows) == 2 and rows[0].shape == (model.args.vocab_size,)
    assert [dec.fed(i) for i in range(2)] == [[5, 6, 7], [8, 9, 10, 11]]
    assert dec.sampler(0) is None and dec.processors(0) == () and dec.remaining(0) == 3
    assert [dec.count(0, 1), dec.count(0, 9999), dec.count(0, 2)] == [None, "stop", "length"]
    gen.insert([[12, 13]], max_tokens=[4])
    seen = []
    responses = mlx_compat.step_with_decoding(gen, lambda batch: seen.append(len(batch)) or [])
    assert seen == [2] and responses == []
    assert mlx_compat.batch_occupancy(gen)[2] == 0, "the waiting prompt should have started its prefill"
    assert "next" not in vars(mlx_compat.decoding_batch(gen)), "mlx-lm's own step should be back"
    gen.close()


def test_tap_prefill_hands_over_every_prefill_pass_with_what_each_sequence_fed(loaded):
    # prompt logprobs come from these passes' logits (engine/lockstep/prompt_logprobs.py)
    model, tok = loaded
    gen = BatchGenerator(model, stop_tokens=[], prefill_step_size=16)
    passes = []
    mlx_compat.tap_prefill(gen, lambda uids, before, fed, logits: passes.append((uids, before, fed, logits.shape)))
    a, b = gen.insert([list(range(5, 45)), list(range(5, 15))], max_tokens=[2, 2])
    for _ in range(6):
        gen.next()
    vocab = model.args.vocab_size
    # every prompt token but the last (fed by decoding) once, in order, right padded to the pass's width
    assert passes == [([a, b], [0, 0], [16, 9], (2, 16, vocab)), ([a], [16], [16], (1, 16, vocab)),
                      ([a], [32], [7], (1, 7, vocab))]
    gen.close()
