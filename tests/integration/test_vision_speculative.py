"""Images with speculative decoding: a draft model (here the served checkpoint's own text model) sees a prompt whose
image tokens have ids past its vocabulary; it is fed them as token 0, so an image request answers with mlx-vlm's
own greedy tokens, drafts proposed, and the next turn (the image's KV reused, its features left on rank 0) too.
An id past the draft's embedding table ended the engine before."""

from __future__ import annotations

from tests import wire
from tests.harness import Stack
from tests.integration.test_vision_engine import QUESTION, ask, image_part, png, reference

MODEL = "mistral3-vision"  # Gemma 3's sliding windows cannot roll drafts back: it decodes plainly


def test_an_image_answers_with_a_draft_model_as_without_one(tmp_path):
    stack = Stack()
    engine = stack.start_engine(MODEL=f"zoo-{MODEL}", SPECULATIVE="draft", DRAFT_MODEL=f"zoo-{MODEL}",
                                NUM_DRAFT_TOKENS="4")
    try:
        data = png(7)
        expected, _ = reference(MODEL, data, tmp_path)
        turn = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}]
        tokens, finish = ask(stack, turn, "spec-1")
        assert tokens == expected
        info = wire.info(stack.socket)
        assert info.spec_mode == "draft" and info.spec_proposed_tokens > 0
        again, second = ask(stack, turn + [{"role": "assistant", "content": "A picture."},
                                           {"role": "user", "content": QUESTION}], "spec-2")
        assert second.cached_tokens >= finish.prompt_tokens - 2 and len(again) == second.completion_tokens
    finally:
        engine.stop()
