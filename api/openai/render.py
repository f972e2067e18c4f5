"""OpenAI's response bodies and stream chunks for chat and legacy completions."""

from __future__ import annotations

import msgspec

import ipc
from api.generation import Choice, Renderer
from api.openai import protocol
from api.openai.protocol import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChoiceLogprobs,
    ChunkChoice,
    ChunkDelta,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    FunctionCall,
    FunctionCallChunk,
    ToolCall,
    ToolCallChunk,
    PromptTokensDetails,
    Usage,
)
from ipc.messages import TokenLogprob


def _usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> Usage:
    return Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                 total_tokens=prompt_tokens + completion_tokens,
                 prompt_tokens_details=PromptTokensDetails(cached_tokens=cached_tokens))


class ChatRenderer(Renderer):
    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None | msgspec.UnsetType) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def first(self, index: int) -> ChatCompletionChunk:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(role="assistant", content=""))], self.chunk_usage)

    def delta(self, choice: Choice, ev: ipc.Delta | ipc.Finish) -> ChatCompletionChunk | None:
        if not (ev.text or ev.reasoning or ev.tool_calls or ev.logprobs):
            return None
        # Each call arrives whole, so one delta carries its id, name and complete arguments.
        calls = [ToolCallChunk(index=len(choice.tool_calls) + i, id=c.id, type="function",
                               function=FunctionCallChunk(name=c.name, arguments=c.arguments))
                 for i, c in enumerate(ev.tool_calls)]
        delta = ChunkDelta(
            content=ev.text if ev.text or not (ev.reasoning or calls) else msgspec.UNSET,
            tool_calls=calls or msgspec.UNSET,
            reasoning_content=ev.reasoning or msgspec.UNSET,
            reasoning=ev.reasoning or msgspec.UNSET,
        )
        logprobs = ChoiceLogprobs(content=_chat_logprobs(ev.logprobs)) if self.logprobs else None
        return self._chunk([ChunkChoice(index=ev.index, delta=delta, logprobs=logprobs)], self.chunk_usage)

    def finish(self, index: int, reason: str) -> ChatCompletionChunk:
        return self._chunk([ChunkChoice(index=index, delta=ChunkDelta(), finish_reason=reason)], self.chunk_usage)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> ChatCompletionChunk:
        return self._chunk([], _usage(prompt_tokens, completion_tokens, self.cached_tokens))

    def response(self, choices: list[Choice], prompt_tokens: int, completion_tokens: int) -> ChatCompletion:
        out = []
        for c in choices:
            content = "".join(c.content)
            reasoning = "".join(c.reasoning)
            message = AssistantMessage(
                # OpenAI answers a turn of only tool calls with content null
                content=None if c.tool_calls and not content.strip() else content,
                tool_calls=[ToolCall(id=t.id, function=FunctionCall(name=t.name, arguments=t.arguments))
                            for t in c.tool_calls] or msgspec.UNSET,
                reasoning_content=reasoning or msgspec.UNSET,
                reasoning=reasoning or msgspec.UNSET,
            )
            logprobs = ChoiceLogprobs(content=_chat_logprobs(c.logprobs)) if self.logprobs else None
            out.append(ChatChoice(index=c.index, message=message, logprobs=logprobs, finish_reason=c.reason))
        return ChatCompletion(id=self.request_id, created=self.created, model=self.model, choices=out,
                              usage=_usage(prompt_tokens, completion_tokens, self.cached_tokens))


class CompletionRenderer(Renderer):
    def _body(self, choices: list[CompletionChoice], usage: Usage | None | msgspec.UnsetType) -> Completion:
        return Completion(id=self.request_id, created=self.created, model=self.model, choices=choices, usage=usage)

    def delta(self, choice: Choice, ev: ipc.Delta | ipc.Finish) -> Completion | None:
        if not (ev.text or ev.logprobs):
            return None
        logprobs = _completion_logprobs(ev.logprobs, choice.offset) if self.logprobs else None
        choice.offset += sum(len(e.token) for e in ev.logprobs)
        return self._body([CompletionChoice(text=ev.text, index=ev.index, logprobs=logprobs)], self.chunk_usage)

    def finish(self, index: int, reason: str) -> Completion:
        return self._body([CompletionChoice(text="", index=index, finish_reason=reason)], self.chunk_usage)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> Completion:
        return self._body([], _usage(prompt_tokens, completion_tokens, self.cached_tokens))

    def response(self, choices: list[Choice], prompt_tokens: int, completion_tokens: int) -> Completion:
        return self._body([
            CompletionChoice(text="".join(c.content), index=c.index, finish_reason=c.reason,
                             logprobs=_completion_logprobs(c.logprobs, 0) if self.logprobs else None)
            for c in choices
        ], _usage(prompt_tokens, completion_tokens, self.cached_tokens))


def _chat_logprobs(entries: list[TokenLogprob]) -> list[protocol.TokenLogprob]:
    return [
        protocol.TokenLogprob(token=e.token, logprob=e.logprob, bytes=e.bytes, top_logprobs=[
            protocol.TopLogprob(token=t.token, logprob=t.logprob, bytes=t.bytes) for t in e.top])
        for e in entries
    ]


def _completion_logprobs(entries: list[TokenLogprob], offset: int) -> CompletionLogprobs:
    """The legacy shape: parallel lists, alternatives as {token: logprob}, offsets into the text."""
    offsets = []
    for e in entries:
        offsets.append(offset)
        offset += len(e.token)
    return CompletionLogprobs(
        tokens=[e.token for e in entries],
        token_logprobs=[e.logprob for e in entries],
        # an echoed prompt's first token has no logprob and no alternatives (null, as OpenAI answers)
        top_logprobs=[None if e.logprob is None else {t.token: t.logprob for t in e.top} for e in entries],
        text_offset=offsets,
    )
