"""KV_BITS=8 served on one rank by the default model: the API's greedy tokens and logprobs are mlx-lm's own with a
quantized cache (not float's: on this prompt they differ by about 0.02), from the prefix cache too, with n > 1, a
grammar and speculative drafts verified in the batch; a model whose KV cannot be quantized is refused in one
sentence, by the engine at start and by the check `launch.sh check` and `start` ask."""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.harness import MODEL_CACHE, Stack, serving, wait_for

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# a prompt that repeats itself, so prompt lookup (SPECULATIVE=ngram) proposes drafts the batch verifies
ECHO = [{"role": "user", "content": "Repeat exactly: one two three four five six seven eight nine ten. "
                                    "one two three four five six seven eight nine ten."}]
MAX_TOKENS = 16
GROUP = 64


@pytest.fixture(scope="module")
def served():
    with serving(MODEL, KV_BITS="8", KV_GROUP_SIZE=str(GROUP), SPECULATIVE="ngram") as both:
        yield both


@pytest.fixture(scope="module")
def stack(served):
    return served[0]


@pytest.fixture(scope="module")
def client(served):
    return served[1]


@pytest.fixture(scope="module")
def reference(stack):
    """mlx-lm alone with its QuantizedKVCache from the first token (quantized_kv_start=0 would attend to the first
    prefill chunk in float before quantizing it; the engine quantizes each chunk as it lands)."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.models.cache import QuantizedKVCache
    from mlx_lm.sample_utils import make_sampler

    from engine.gguf import packaged_model_path

    model, tokenizer = load(str(packaged_model_path("135m", MODEL_CACHE)))

    def greedy(messages, max_tokens=MAX_TOKENS):
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        cache = [QuantizedKVCache(GROUP, 8) for _ in model.layers]
        steps = list(stream_generate(model, tokenizer, tokenizer.encode(prompt), max_tokens=max_tokens,
                                     sampler=make_sampler(temp=0.0), prompt_cache=cache, kv_bits=8,
                                     kv_group_size=GROUP, quantized_kv_start=0))
        tokens = [r.token for r in steps if r.token not in tokenizer.eos_token_ids]
        return {"text": tokenizer.decode(tokens), "logprobs": [float(r.logprobs[r.token]) for r in steps[:len(tokens)]]}

    out = {"question": greedy(QUESTION), "echo": greedy(ECHO, 40)}
    del model
    mx.clear_cache()
    return out


def _ask(client, messages=QUESTION, max_tokens=MAX_TOKENS, **more):
    return client.chat.completions.create(model="default", messages=messages, max_tokens=max_tokens, temperature=0,
                                          logprobs=True, **more)


def _logprobs(choice) -> list[float]:
    return [t.logprob for t in choice.logprobs.content]


def test_greedy_tokens_and_logprobs_are_mlx_lms_with_a_quantized_cache_from_the_prefix_cache_too(client, reference):
    want = reference["question"]
    first = _ask(client)
    assert first.choices[0].message.content == want["text"]
    assert _logprobs(first.choices[0]) == pytest.approx(want["logprobs"], abs=1e-4)
    # the same prompt, now from the prefix cache: stored quantized, reused as such (an answer may reach the client
    # a step before its entry is stored)
    again = wait_for(lambda: (r := _ask(client)).usage.prompt_tokens_details.cached_tokens and r, 60,
                     "a prefix cache hit")
    assert again.choices[0].message.content == want["text"]
    assert _logprobs(again.choices[0]) == pytest.approx(want["logprobs"], abs=1e-4)


def test_health_and_metrics_show_the_precision_and_admission_counts_the_quantized_bytes(stack):
    from prometheus_client.parser import text_string_to_metric_families

    from engine.rank0.kv_precision import row_bytes

    kv = json.loads(urllib.request.urlopen(stack.base_url + "/health", timeout=30).read())["kv_memory"]
    assert (kv["precision"], kv["bits"], kv["group_size"]) == ("8-bit, group 64", 8, GROUP)
    # SmolLM2: 30 layers x K and V x 3 heads of 64, computed in float32 (its norms are): 0.28x of float's 46080
    assert kv["token_bytes"] == 30 * 2 * 3 * row_bytes(64, 4, 8, GROUP) == 12960 and kv["measured"]
    text = urllib.request.urlopen(stack.base_url + "/metrics", timeout=30).read().decode()
    (labels,) = [s.labels for f in text_string_to_metric_families(text) for s in f.samples if s.name == "mcs_kv_cache_info"]
    assert labels == {"precision": "8-bit, group 64", "bits": "8", "group_size": str(GROUP)}


def _spec_counts(stack) -> tuple[float, float]:
    """(proposed, accepted) draft tokens since the engine started, from /metrics."""
    text = urllib.request.urlopen(stack.base_url + "/metrics", timeout=30).read().decode()
    value = {line.split()[0]: float(line.split()[1]) for line in text.splitlines() if line.startswith("mcs_spec_")}
    return value["mcs_spec_proposed_tokens_total"], value["mcs_spec_accepted_tokens_total"]


def test_n_choices_a_grammar_and_verified_drafts_keep_working(stack, client, reference):
    proposed, accepted = _spec_counts(stack)
    two = _ask(client, n=2)
    assert [c.message.content for c in two.choices] == [reference["question"]["text"]] * 2
    ask = "Write a JSON object with keys name and age for a person called Ada, aged 36."
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": ask}], max_tokens=32,
                                       temperature=0, response_format={"type": "json_object"})
    assert isinstance(json.loads(r.choices[0].message.content), dict)
    # prompt lookup proposes the repeated words; the batch verifies them and rolls back the rejected ones
    echo = _ask(client, ECHO, 40)
    assert echo.choices[0].message.content == reference["echo"]["text"]
    more, kept = _spec_counts(stack)
    assert kept > accepted and more - proposed > kept - accepted  # drafts kept, and some dropped from the cache


def test_a_model_whose_kv_cannot_be_quantized_is_refused_in_one_sentence_at_check_and_at_start(monkeypatch):
    from config import load_settings
    from ops.kvquant_check import kv_quant_refusal

    s = Stack(extra={"KV_BITS": "8", "KV_GROUP_SIZE": "32"})  # demo-tiny: head_dim 16, below any group size
    why = ("KV_BITS=8 with KV_GROUP_SIZE=32 cannot quantize this model's KV: its head_dim of 16 is not a multiple "
           "of 32; set KV_BITS=off to serve it")
    for name, value in s.env().items():  # the check's child process reads the environment, as under launch.sh
        monkeypatch.setenv(name, value)
    assert kv_quant_refusal(load_settings()) == why
    try:
        engine = s.start_engine(timeout=120)
    except RuntimeError as exc:
        assert "engine exited" in str(exc) and why in str(exc)
    else:
        engine.stop()  # never left running by a failing test
        pytest.fail("the engine started with KV_BITS=8 on a model it cannot quantize")


def test_a_stream_cancelled_mid_decode_leaves_its_neighbour_exact_and_the_engine_serving(stack, client, reference):
    from tests.harness import assert_engine_logs_clean

    # a long answer (SmolLM2's end tokens banned; 4000 tokens take minutes on this CPU, so only the cancellation
    # empties the batch within the wait below) that the client drops while the question decodes beside it
    endless = client.chat.completions.create(model="default", messages=ECHO, max_tokens=4000, temperature=0,
                                             stream=True, logit_bias={"0": -100, "2": -100})
    long_chunks = iter(endless)
    next(long_chunks)
    beside = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=MAX_TOKENS,
                                            temperature=0, stream=True)
    text = []
    for chunk in beside:
        if chunk.choices and chunk.choices[0].delta.content:
            if not text:
                next(long_chunks)  # both are decoding in one batch now
                endless.close()
            text.append(chunk.choices[0].delta.content)
    assert "".join(text) == reference["question"]["text"]
    wait_for(lambda: stack.probe()["active"] == 0, 30, "the cancelled stream to leave the batch")
    assert _ask(client).choices[0].message.content == reference["question"]["text"]
    assert_engine_logs_clean(stack)
