"""The default model served on one rank answers in words, and every dialect gives mlx-lm's own greedy answer: the
same tokens as in-process `stream_generate`, logprobs within 1e-4, with the prefix cache hit and with it off."""

from __future__ import annotations

import json

import anthropic
import ollama
import openai
import pytest

from tests.harness import MODEL_CACHE, Stack

MODEL = "smollm2-135m"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
MAX_TOKENS = 16  # the answer ends on its own well before


@pytest.fixture(scope="module")
def stack():
    s = Stack(extra={"MODEL": MODEL})
    s.procs = {"engine": s.start_engine(), "api": s.start_api()}
    yield s
    for p in s.procs.values():
        p.stop()


@pytest.fixture(scope="module")
def client(stack):
    with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0, timeout=300) as c:
        yield c


@pytest.fixture(scope="module")
def reference(stack):
    """mlx-lm alone on the folder the engine converted: the greedy tokens and their logprobs, and the prompt."""
    import mlx.core as mx
    from mlx_lm import load, stream_generate
    from mlx_lm.sample_utils import make_sampler

    from engine.gguf import packaged_model_path

    model, tokenizer = load(str(packaged_model_path("135m", MODEL_CACHE)))
    prompt = tokenizer.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False)
    steps = list(stream_generate(model, tokenizer, tokenizer.encode(prompt), max_tokens=MAX_TOKENS,
                                 sampler=make_sampler(temp=0.0)))
    tokens = [r.token for r in steps if r.token not in tokenizer.eos_token_ids]
    logprobs = [float(r.logprobs[r.token]) for r in steps[:len(tokens)]]
    del model
    mx.clear_cache()
    return {"prompt": prompt, "tokens": tokens, "text": tokenizer.decode(tokens), "logprobs": logprobs,
            "pieces": [tokenizer.decode([t]) for t in tokens]}


def test_it_answers_in_words_and_writes_json_that_parses(client) -> None:
    answer = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0)
    assert "Paris" in answer.choices[0].message.content
    ask = "Write a JSON object with keys name and age for a person called Ada, aged 36."
    r = client.chat.completions.create(model="default", messages=[{"role": "user", "content": ask}], max_tokens=32,
                                       temperature=0, response_format={"type": "json_object"})
    assert json.loads(r.choices[0].message.content) == {"name": "Ada", "age": 36}


def test_every_dialect_gives_mlx_lms_greedy_tokens_and_logprobs(stack, client, reference) -> None:
    chat = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0,
                                          logprobs=True)
    assert chat.choices[0].message.content == reference["text"]
    assert [t.token for t in chat.choices[0].logprobs.content] == reference["pieces"]
    assert [t.logprob for t in chat.choices[0].logprobs.content] == pytest.approx(reference["logprobs"], abs=1e-4)
    # the same prompt again, now from the prefix cache
    again = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0,
                                           logprobs=True)
    assert again.usage.prompt_tokens_details.cached_tokens > 0
    assert [t.logprob for t in again.choices[0].logprobs.content] == pytest.approx(reference["logprobs"], abs=1e-4)
    assert again.choices[0].message.content == reference["text"]

    done = client.completions.create(model="default", prompt=reference["prompt"], max_tokens=MAX_TOKENS,
                                     temperature=0, logprobs=1)
    assert done.choices[0].logprobs.tokens == reference["pieces"]
    assert done.choices[0].logprobs.token_logprobs == pytest.approx(reference["logprobs"], abs=1e-4)

    with anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0, timeout=300) as claude:
        m = claude.messages.create(model="default", max_tokens=MAX_TOKENS, messages=QUESTION,
                                   extra_body={"temperature": 0})
    assert "".join(b.text for b in m.content if b.type == "text") == reference["text"]

    r = client.responses.create(model="default", input=QUESTION[0]["content"], max_output_tokens=MAX_TOKENS,
                                temperature=0)
    assert r.output_text == reference["text"]

    with ollama.Client(host=stack.base_url, timeout=300) as local:
        o = local.chat(model="default", messages=QUESTION, options={"temperature": 0, "num_predict": MAX_TOKENS})
    assert o.message.content == reference["text"]


def test_prefix_cache_off_gives_the_same_answer(stack, client, reference) -> None:
    # last in the module: the same API, a new engine without a prefix cache
    stack.procs["engine"].stop()
    stack.procs["engine"] = stack.start_engine(PROMPT_CACHE_BYTES="0")
    r = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=MAX_TOKENS, temperature=0,
                                       logprobs=True)
    assert r.choices[0].message.content == reference["text"]
    assert [t.logprob for t in r.choices[0].logprobs.content] == pytest.approx(reference["logprobs"], abs=1e-4)
