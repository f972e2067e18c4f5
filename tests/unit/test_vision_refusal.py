"""An image sent to a model without vision gets a 400 naming the image's field, never a silently dropped picture."""

from __future__ import annotations

import pytest

from engine.rank0 import validate
from engine.rank0.errors import Refused
from ipc import Generate, SamplingParams

PNG = b"\x89PNG\r\n\x1a\n"
IMAGE = {"type": "image", "sha256": "0" * 64, "media_type": "image/png", "width": 1, "height": 1, "data": PNG}


def chat(*messages: dict) -> Generate:
    return Generate(request_id="chatcmpl-1", kind="chat", params=SamplingParams(max_tokens=4), messages=list(messages))


def limits(vision: bool) -> validate.Limits:
    return validate.Limits(vocab_size=1000, logits_size=1024, context_length=4096, max_batch=4, max_queue=4,
                           vision=vision, model="demo-tiny")


def test_an_image_to_a_text_model_is_refused_naming_its_field() -> None:
    gen = chat({"role": "user", "content": "hi"},
               {"role": "user", "content": [{"type": "text", "text": "what is this?"}, IMAGE]})
    with pytest.raises(Refused) as refused:
        validate.check(gen, limits(vision=False))
    error = refused.value.error
    assert (error.status, error.param) == (400, "messages[1].content[1]")
    assert error.message == ("model demo-tiny does not take images; serve a vision-language model (docs/vision.md) "
                             "or send text only")


def test_a_vision_model_takes_the_same_chat() -> None:
    gen = chat({"role": "user", "content": [IMAGE, {"type": "text", "text": "what is this?"}]})
    assert validate.check(gen, limits(vision=True)) is gen
