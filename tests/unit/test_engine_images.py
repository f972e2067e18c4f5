"""Rank 0's check of image parts: a model without vision refuses them with the one error every dialect relays,
naming the first image's place; a model with vision lets them through."""

from __future__ import annotations

import dataclasses

import pytest

from engine.rank0 import validate
from engine.rank0.errors import Refused
from ipc import Generate, SamplingParams, Tokenize

LIMITS = validate.Limits(vocab_size=1000, logits_size=1024, context_length=4096, max_batch=4, max_queue=4,
                         model="demo-tiny")
IMAGE = {"type": "image", "sha256": "0" * 64, "media_type": "image/png", "width": 3, "height": 2, "data": b"\x89PNG"}
MESSAGES = [{"role": "system", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "what is it?"}, IMAGE]}]
REFUSAL = "model demo-tiny does not take images; serve a vision-language model (docs/vision.md) or send text only"


def test_a_model_without_vision_refuses_an_image_naming_its_place():
    gen = Generate(request_id="chatcmpl-1", kind="chat", params=SamplingParams(max_tokens=4), messages=MESSAGES)
    with pytest.raises(Refused) as info:
        validate.check(gen, LIMITS)
    error = info.value.error
    assert (error.status, error.param, error.message) == (400, "messages[1].content[1]", REFUSAL)
    with pytest.raises(Refused) as info:
        validate.check_tokenize(Tokenize(kind="chat", messages=MESSAGES), LIMITS)
    assert info.value.error.message == REFUSAL


def test_a_model_with_vision_takes_image_parts_and_text_parts_pass_everywhere():
    gen = Generate(request_id="chatcmpl-1", kind="chat", params=SamplingParams(max_tokens=4), messages=MESSAGES)
    assert validate.check(gen, dataclasses.replace(LIMITS, vision=True)) == gen
    text_parts = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    validate.check(Generate(request_id="chatcmpl-2", kind="chat", params=SamplingParams(max_tokens=4),
                            messages=text_parts), LIMITS)
