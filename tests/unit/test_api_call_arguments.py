"""A closed tool call whose arguments are not a JSON object never reaches a client as a call (Anthropic's and
Ollama's input would be {} and the tool would run with nothing): every dialect, streamed and not, ends the request
with its error, against a fake engine speaking the real wire protocol."""

from __future__ import annotations

import pytest

import ipc
from ipc.messages import ToolCall
from tests.unit.named_events import play

pytestmark = pytest.mark.anyio

USER = [{"role": "user", "content": "Hi"}]
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
DIALECTS = {
    "chat": ("/v1/chat/completions", {"messages": USER, "tools": [TOOL]}),
    "responses": ("/v1/responses", {"input": "Hi", "tools": [{"type": "function", "name": "get_weather",
                                                              "parameters": {"type": "object"}}]}),
    "anthropic": ("/v1/messages", {"max_tokens": 16, "messages": USER,
                                   "tools": [{"name": "get_weather", "input_schema": {"type": "object"}}]}),
    "ollama": ("/api/chat", {"messages": USER, "tools": [TOOL]}),
}
# what each dialect calls a call: none of them may appear
CALL_SHAPES = ('"tool_calls"', '"tool_use"', '"function_call"')


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("arguments", ["[1, 2]", "Paris", ""])
async def test_arguments_that_are_not_an_object_are_an_error_never_an_empty_input(engine, client, caplog, dialect,
                                                                                  stream, arguments):
    call = ToolCall(id="call_abc", name="get_weather", arguments=arguments)
    play(engine, ipc.Delta(request_id="", text="Sure.", completion_tokens=1),
         ipc.Finish(request_id="", finish_reason="stop", prompt_tokens=7, completion_tokens=9, tool_calls=[call]))
    path, body = DIALECTS[dialect]
    r = await client.post(path, json={"model": "test-model", **body, "stream": stream})
    assert "with arguments that are not a JSON object" in r.text
    assert not stream or r.status_code == 200  # the stream had begun: the error is its last event
    assert stream or r.status_code == 500
    assert not any(shape in r.text for shape in CALL_SHAPES), r.text
    assert "whose arguments are not a JSON object" in caplog.text
