"""Vision-language models served by the engine (one rank), a family that places a fixed number of image tokens
(Gemma 3), one whose count follows the picture's size (Mistral 3) and three whose image tokens take M-RoPE
positions (Qwen2.5-VL; Qwen3-VL with DeepStack; Qwen3.5 with linear attention): text alone works, an image request answers with mlx-vlm's own greedy tokens
for the same image, also in its next turn after a prefix cache hit and batched with others, and the prefix cache
tells images apart by content.

Frames carry the canonical image part the gateway sends (ipc Generate.messages), built here directly.
"""

from __future__ import annotations

import hashlib
import io
from concurrent.futures import ThreadPoolExecutor

import pytest

from ipc import Delta, Error, Finish, Generate, SamplingParams, Tokenize
from tests import wire
from tests.harness import MODEL_CACHE, Stack

MODELS = ("gemma3-vision", "mistral3-vision", "qwen2_5_vl-vision", "qwen3_vl-vision", "qwen3_5-vision")
MAX_TOKENS = 12
QUESTION = "Describe the picture."


def png(seed: int, height: int = 48, width: int = 64) -> bytes:
    import numpy as np
    from PIL import Image

    pixels = (np.arange(height * width * 3).reshape(height, width, 3) * (seed * 2 + 1) % 251).astype(np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def image_part(data: bytes) -> dict:
    return {"type": "image", "sha256": hashlib.sha256(data).hexdigest(), "media_type": "image/png",
            "width": 64, "height": 64, "data": data}


@pytest.fixture(scope="module", params=MODELS)
def stack(request):
    s = Stack()
    engine = s.start_engine(MODEL=f"zoo-{request.param}")
    s.model = request.param
    yield s
    engine.stop()


def ask(stack: Stack, messages: list[dict], rid: str) -> tuple[list[bytes], Finish]:
    """Each generated token's bytes (logprobs carry them), and the Finish."""
    frames = wire.run(stack.socket, Generate(request_id=rid, kind="chat", messages=messages,
                                             params=SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0,
                                                                   logprobs=True)),
                      timeout=120)
    assert not [f for f in frames if isinstance(f, Error)], frames
    finish = frames[-1]
    assert isinstance(finish, Finish), frames
    return [bytes(lp.bytes) for f in frames if isinstance(f, (Delta, Finish)) for lp in f.logprobs], finish


def reference(model_name: str, data: bytes, tmp_path, messages: list[dict] | None = None) -> tuple[list[bytes], int]:
    """mlx-vlm's own greedy tokens (each one's bytes) for the same chat (by default QUESTION and the image; else
    `messages`, whose image parts are this image) in this process, and its prompt length."""
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm import generate, load

    from engine.rank0.logprobs import TokenTexts
    from engine.zoo import ensure_zoo_model

    folder = ensure_zoo_model(model_name, MODEL_CACHE)
    model, processor = load(str(folder))
    tokenizer = processor.tokenizer
    if messages is None:
        messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, {"type": "image"}]}]
    messages = [{**m, "content": [{"type": "image"} if p.get("type") == "image" else p for p in m["content"]]}
                if isinstance(m["content"], list) else m for m in messages]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    path = tmp_path / "image.png"
    path.write_bytes(data)
    result = generate(model, processor, text, image=[str(path)], max_tokens=MAX_TOKENS, temperature=0.0,
                      verbose=False)
    texts = TokenTexts(load_tokenizer(folder))
    return [bytes(texts.get(t)[1]) for t in result.token_ids], result.prompt_tokens


def test_the_model_says_it_takes_images_and_answers_text(stack):
    assert wire.info(stack.socket).facts.vision
    tokens, finish = ask(stack, [{"role": "user", "content": QUESTION}], "text-only")
    assert finish.completion_tokens == MAX_TOKENS == len(tokens)


def test_an_image_answers_as_mlx_vlm_does_and_counts_its_tokens(stack, tmp_path):
    data = png(1)
    expected, prompt_tokens = reference(stack.model, data, tmp_path)
    text, finish = ask(stack, [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}],
                       "image-1")
    assert text == expected
    assert finish.prompt_tokens == prompt_tokens  # the image's tokens and its markers counted
    (tokenized,) = wire.run(stack.socket, Tokenize(kind="chat", messages=[
        {"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}]))
    assert len(tokenized.tokens) == prompt_tokens  # /tokenize counts them as a generation does
    other, _ = ask(stack, [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(png(2))]}],
                   "image-2")
    assert other != text  # the answer depends on the picture


def test_the_prefix_cache_reuses_the_same_image_and_not_another_of_its_size(stack, tmp_path):
    first, second = png(3), png(4)
    turn = [{"role": "user", "content": [image_part(first), {"type": "text", "text": QUESTION}]}]
    _, before = ask(stack, turn, "turn-1")
    reply = {"role": "assistant", "content": "It is a picture."}
    follow = turn + [reply, {"role": "user", "content": "And the colours?"}]
    text, again = ask(stack, follow, "turn-2")
    # everything up to the first turn's end was computed once: the image's tokens included
    assert again.cached_tokens >= before.prompt_tokens - 2
    # and the tokens after it sit where mlx-vlm puts them (for M-RoPE: past the image's positions)
    assert text == reference(stack.model, first, tmp_path, follow)[0]
    swapped = [{"role": "user", "content": [image_part(second), {"type": "text", "text": QUESTION}]}]
    _, other = ask(stack, swapped + [reply, {"role": "user", "content": "And the colours?"}], "turn-3")
    # the same size, another picture: only the tokens before it are reused
    assert other.cached_tokens < 8


def test_images_and_text_batched_together_answer_as_each_does_alone(stack):
    """Sequences with images of two sizes and one without share the batch (for M-RoPE: each keeps its own
    positions), and each answers as it does alone."""
    chats = [[{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(png(7))]}],
             [{"role": "user", "content": [image_part(png(8, 64, 32)), {"type": "text", "text": QUESTION}]}],
             [{"role": "user", "content": "And the colours?"}]]
    alone = [ask(stack, chat, f"alone-{i}")[0] for i, chat in enumerate(chats)]
    with ThreadPoolExecutor(len(chats)) as pool:
        together = list(pool.map(lambda i: ask(stack, chats[i], f"together-{i}")[0], range(len(chats))))
    assert together == alone


def test_an_unreadable_image_is_a_400_naming_it_and_the_engine_serves_on(stack):
    bad = image_part(b"GIF89a truncated")
    frames = wire.run(stack.socket, Generate(request_id="bad-image", kind="chat", params=SamplingParams(max_tokens=2),
                                             messages=[{"role": "user", "content": [{"type": "text", "text": "?"},
                                                                                    bad]}]))
    (error,) = frames
    assert isinstance(error, Error) and (error.status, error.param) == (400, "messages[0].content[1]")
    _, finish = ask(stack, [{"role": "user", "content": [image_part(png(6))]}], "after-bad")
    assert finish.completion_tokens == MAX_TOKENS
