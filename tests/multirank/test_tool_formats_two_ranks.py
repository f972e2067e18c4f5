"""Forced calls in two formats of different kinds on two ranks spawned by mlx.launch: JSON arguments in Kimi K2's
special-token envelope and Qwen3-Coder's XML parameters (raw text and JSON values). Every rank masks its logits
with the same grammar, so the ranks stay in step and the calls validate, streamed as not streamed."""

from __future__ import annotations

import anthropic
import openai
import pytest

from tests.harness import Stack, assert_engine_logs_clean
from tests.integration.test_tool_formats_served import _chat, _messages, _valid

pytestmark = pytest.mark.multirank


# a JSON format, an XML one, and gpt-oss's harmony channels on its own architecture (sliding window, sinks, MoE)
@pytest.mark.parametrize("model", ["tools-kimi_k2", "tools-qwen3_coder", "gpt-oss-harmony"])
def test_forced_calls_in_the_models_own_format_on_two_ranks(model: str) -> None:
    stack = Stack(extra={"MODEL": f"zoo-{model}"})
    engine = stack.start_engine(ranks=2)
    try:
        api = stack.start_api()
        try:
            assert stack.probe()["ranks"] == 2
            with openai.OpenAI(base_url=stack.base_url + "/v1", api_key="x", max_retries=0, timeout=120) as client:
                _valid(_chat(client, "required"))
                _valid(_chat(client, {"type": "function", "function": {"name": "get_time"}}), "get_time")
            with anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0, timeout=120) as claude:
                _valid(_messages(claude, {"type": "tool", "name": "get_weather"}), "get_weather")
            assert stack.probe() is not None  # no desync ended the engine
        finally:
            api.stop()
    finally:
        engine.stop()
    assert_engine_logs_clean(stack)
