"""LangChain's ChatOpenAI against the real engine: invoke, stream, and a forced tool through bind_tools."""

from __future__ import annotations

import pytest

langchain_openai = pytest.importorskip("langchain_openai")

WEATHER = {
    "title": "get_weather",
    "description": "Forecast for a city",
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Rome"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
}


@pytest.fixture(scope="module")
def llm(stack):
    return langchain_openai.ChatOpenAI(base_url=stack.base_url + "/v1", api_key="unused", model="default",
                                       max_retries=0, timeout=60, max_tokens=16, temperature=0)


def test_invoke_and_stream_agree(llm):
    reply = llm.invoke("hello")
    assert isinstance(reply.content, str) and reply.content
    assert reply.response_metadata["finish_reason"] in ("stop", "length")
    assert reply.usage_metadata["output_tokens"] > 0
    chunks = list(llm.stream("hello"))
    assert len(chunks) > 2
    assert "".join(c.content for c in chunks) == reply.content


def test_bind_tools_with_a_forced_tool(llm):
    bound = llm.bind_tools([WEATHER], tool_choice="get_weather")
    reply = bound.invoke("What is the weather in Paris?", max_tokens=80)
    (call,) = reply.tool_calls
    assert call["name"] == "get_weather"
    assert call["args"]["city"] in ("Paris", "Rome") and 1 <= call["args"]["days"] <= 7
    assert call["id"]
    streamed = None
    for chunk in bound.stream("What is the weather in Paris?", max_tokens=80):
        streamed = chunk if streamed is None else streamed + chunk
    assert [c["name"] for c in streamed.tool_calls] == ["get_weather"]
    assert streamed.tool_calls[0]["args"] == call["args"]
