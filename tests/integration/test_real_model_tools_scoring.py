"""The default real model (SmolLM2-135M-Instruct, whose ChatML template has no tool syntax) asked for a tool and
scored through the API: what a user would recognise, not only plumbing. Runs wherever MODEL smollm2-135m resolves
(setup builds it from its wheel); skipped, saying why, where it does not."""

from __future__ import annotations

import json
import math
import os

import pytest

from bench.perplexity import api_logprobs, inprocess_logprobs, model_folder, perplexity
from engine.load_errors import ModelError
from tests.harness import MODEL_CACHE, serving

REAL_MODEL = os.environ.get("REAL_MODEL", "smollm2-135m")
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a given location",
    "parameters": {"type": "object", "properties": {"location": {"type": "string", "description": "The city"}},
                   "required": ["location"]}}}]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# plain English (72 tokens): short, since this CPU prefills the 4-bit model at a few tokens a second
PROSE = ("Paris is the capital and largest city of France. It is known for its museums, its cafes and the Eiffel "
         "Tower, which was built for the World's Fair of 1889. Every year millions of visitors walk along the river "
         "Seine, visit the Louvre and climb the hill of Montmartre to see the city from above.")


@pytest.fixture(scope="module")
def real():
    try:
        folder = model_folder(REAL_MODEL, MODEL_CACHE)
    except ModelError as exc:
        pytest.skip(f"MODEL={REAL_MODEL} is not available here ({exc}); ./launch.sh setup builds it")
    with serving(REAL_MODEL, timeout=600) as (stack, client):
        yield folder, client, stack


def test_the_weather_in_paris_is_a_get_weather_call_for_paris(real):
    _, client, stack = real
    # the tools prompt (193 tokens) is prefilled in chunks paced to this host, each within a quarter of the default
    # WATCHDOG_TIMEOUT (30 s): MLX's CPU build prefills this model at a few tokens a second, where 512 would kill it
    info = stack.probe()
    assert info["prefill_tokens_per_second"] > 0
    assert info["prefill_chunk"] == 16 or info["prefill_chunk"] / info["prefill_tokens_per_second"] <= 30 / 4
    r = client.chat.completions.create(model="default", messages=ASK, tools=WEATHER, tool_choice="required",
                                       max_tokens=64, temperature=0)
    calls = r.choices[0].message.tool_calls
    assert calls and r.choices[0].finish_reason == "tool_calls"
    for call in calls:  # parallel calls allowed: each one is the weather for Paris
        assert call.function.name == "get_weather"
        assert "paris" in json.loads(call.function.arguments)["location"].lower()
    # left to choose, it calls the tool or answers in words, never with the envelope's markup
    auto = client.chat.completions.create(model="default", messages=ASK, tools=WEATHER, max_tokens=32, temperature=0)
    message = auto.choices[0].message
    assert [c.function.name for c in message.tool_calls or []] in ([], ["get_weather"])
    assert "<tool_call>" not in (message.content or "")


def test_perplexity_through_the_api_equals_mlx_lm_in_process_on_real_text(real):
    folder, client, _ = real
    served, local = api_logprobs(client, PROSE)[1], inprocess_logprobs(folder, PROSE)
    assert len(served) == len(local)
    assert math.isclose(perplexity(served), perplexity(local), rel_tol=1e-3)
    # SmolLM2-135M-Instruct reads it at about 8.5 (mlx-lm); random weights guess at about the vocabulary's size
    assert perplexity(served) < 30
