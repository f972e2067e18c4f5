"""Each 4-bit zoo model served by the real engine on one rank answers a chat request, prefix cache off; on each
cache kind, a second turn starts from the first with the prefix cache on.

SERVED lists the zoo models this holds for; add a model (or a setting: the prefix cache on, two
ranks) to the lists as the engine learns to serve it."""

from __future__ import annotations

import pytest

from engine.zoo import FAMILIES
from engine.zoo.names import QUANTIZED_SUFFIX
from tests.harness import Stack, assert_engine_logs_clean

# Every family's own weights are served with the prefix cache off, their greedy tokens checked against mlx-lm's,
# by test_zoo_fidelity.py; here the 4-bit ones, through the chat endpoint (one template for all).
SERVED = tuple(family + QUANTIZED_SUFFIX for family in FAMILIES)
# A second turn's path depends on the cache kinds a model's layers hold (mlx-lm's make_prompt_cache): plain
# KVCache (llama; deepseek-v3's latent: keys and values of other widths), linear attention's ArraysCache with
# KVCache (qwen3.5, as qwen3-next), a 32-token RotatingKVCache with KVCache (gpt-oss, as ministral3). Every
# family's greedy answers with the prefix cache on, a request sharing the one before's prompt, are checked against
# mlx-lm by test_zoo_fidelity.py; qwen3-next's second turn also by tests/multirank/test_pipeline.py.
CACHE_KINDS = ("llama", "deepseek-v3", "qwen3.5", "gpt-oss")
CACHE_OFF = {"PROMPT_CACHE_BYTES": "0"}


@pytest.mark.parametrize("name", SERVED)
def test_serves_one_chat_request_with_the_prefix_cache_off(name: str) -> None:
    openai = pytest.importorskip("openai")
    stack = Stack(extra={"MODEL": "zoo-" + name, **CACHE_OFF})
    engine = stack.start_engine()
    try:
        api = stack.start_api()
        try:
            with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
                reply = client.chat.completions.create(
                    model="zoo-" + name, max_tokens=12, temperature=0,
                    messages=[{"role": "user", "content": "Tell me a story about a cluster of Macs. " * 2}])
        finally:
            api.stop()
    finally:
        engine.stop()
    assert reply.choices[0].message.content and reply.usage.completion_tokens == 12
    assert_engine_logs_clean(stack)


@pytest.mark.parametrize("name", CACHE_KINDS)
def test_a_second_turn_starts_from_the_first_with_the_prefix_cache_on(name: str) -> None:
    openai = pytest.importorskip("openai")
    stack = Stack(extra={"MODEL": "zoo-" + name})
    engine = stack.start_engine()
    try:
        api = stack.start_api()
        try:
            with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="unused", max_retries=0, timeout=60) as client:
                messages = [{"role": "system", "content": "Answer in one line. " * 20},
                            {"role": "user", "content": "Tell me a story about a cluster of Macs."}]
                one = client.chat.completions.create(model="zoo-" + name, max_tokens=8, temperature=0,
                                                     messages=messages)
                messages += [{"role": "assistant", "content": one.choices[0].message.content},
                             {"role": "user", "content": "Another one."}]
                two = client.chat.completions.create(model="zoo-" + name, max_tokens=8, temperature=0,
                                                     messages=messages)
        finally:
            api.stop()
    finally:
        engine.stop()
    # all of turn one's prompt but its last token (a model whose entries cannot be cut keeps the state before it)
    assert two.usage.prompt_tokens_details.cached_tokens >= one.usage.prompt_tokens - 1
    assert_engine_logs_clean(stack)
