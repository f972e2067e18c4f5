"""A vision-language model served by the engine (one rank): text alone works, an image request answers with
mlx-vlm's own greedy tokens for the same image, and the prefix cache tells images apart by content.

Frames carry the canonical image part the gateway sends (ipc Generate.messages), built here directly.
"""

from __future__ import annotations

import hashlib
import io

import pytest

from ipc import Delta, Error, Finish, Generate, SamplingParams
from tests import wire
from tests.harness import MODEL_CACHE, Stack

MODEL = "gemma3-vision"
MAX_TOKENS = 12
QUESTION = "Describe the picture."


def png(seed: int) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.arange(64 * 64 * 3).reshape(64, 64, 3) * (seed * 2 + 1) % 251).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def image_part(data: bytes) -> dict:
    return {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": "image/png",
            "width": 64, "height": 64, "data": data}


@pytest.fixture(scope="module")
def stack():
    s = Stack()
    engine = s.start_engine(MODEL=f"zoo-{MODEL}")
    yield s
    engine.stop()


def ask(stack: Stack, messages: list[dict], rid: str) -> tuple[str, Finish]:
    frames = wire.run(stack.socket, Generate(request_id=rid, kind="chat", messages=messages,
                                             params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0)),
                      timeout=120)
    assert not [f for f in frames if isinstance(f, Error)], frames
    finish = frames[-1]
    assert isinstance(finish, Finish), frames
    return "".join(f.text for f in frames if isinstance(f, Delta)), finish


def printable(text: str) -> str:
    """The engine's streamed text leaves out control characters a random model emits; the rest must match."""
    return "".join(c for c in text if c.isprintable() or c in "\n\t")


def reference(data: bytes, tmp_path) -> str:
    """mlx-vlm's own greedy answer for the same chat and image, in this process."""
    from mlx_vlm import generate, load

    from engine.zoo import ensure_zoo_model

    folder = ensure_zoo_model(MODEL, MODEL_CACHE)
    model, processor = load(str(folder))
    tokenizer = processor.tokenizer
    text = tokenizer.apply_chat_template([{"role": "user", "content": [{"type": "text", "text": QUESTION},
                                                                       {"type": "image"}]}],
                                         tokenize=False, add_generation_prompt=True)
    path = tmp_path / "image.png"
    path.write_bytes(data)
    result = generate(model, processor, text, image=[str(path)], max_tokens=MAX_TOKENS, temperature=0.0,
                      verbose=False)
    return tokenizer.decode(result.token_ids, skip_special_tokens=True), result.prompt_tokens


def test_the_model_says_it_takes_images_and_answers_text(stack):
    assert wire.info(stack.socket).facts.vision
    text, finish = ask(stack, [{"role": "user", "content": QUESTION}], "text-only")
    assert finish.completion_tokens == MAX_TOKENS and text


def test_an_image_answers_as_mlx_vlm_does_and_counts_its_tokens(stack, tmp_path):
    data = png(1)
    expected, prompt_tokens = reference(data, tmp_path)
    text, finish = ask(stack, [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}],
                       "image-1")
    assert printable(text) == printable(expected)
    assert finish.prompt_tokens == prompt_tokens  # the image's 16 tokens and its markers counted
    other, _ = ask(stack, [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(png(2))]}],
                   "image-2")
    assert other != text  # the answer depends on the picture


def test_the_prefix_cache_reuses_the_same_image_and_not_another_of_its_size(stack):
    first, second = png(3), png(4)
    turn = [{"role": "user", "content": [image_part(first), {"type": "text", "text": QUESTION}]}]
    _, before = ask(stack, turn, "turn-1")
    reply = {"role": "assistant", "content": "It is a picture."}
    _, again = ask(stack, turn + [reply, {"role": "user", "content": "And the colours?"}], "turn-2")
    # everything up to the first turn's end was computed once: the image's tokens included
    assert again.cached_tokens >= before.prompt_tokens - 2
    swapped = [{"role": "user", "content": [image_part(second), {"type": "text", "text": QUESTION}]}]
    _, other = ask(stack, swapped + [reply, {"role": "user", "content": "And the colours?"}], "turn-3")
    # the same size, another picture: only the tokens before it are reused
    assert other.cached_tokens < 8
