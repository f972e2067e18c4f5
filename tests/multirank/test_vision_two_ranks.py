"""A vision-language model on two real ranks in tensor parallel: rank 0 alone runs the tower, the features travel
in the plan, and both ranks' prefill reads them, so an image request answers with mlx-vlm's own greedy tokens (as
one rank does) and a second turn with the same image reuses the first's KV on every rank and answers as mlx-vlm
does."""

from __future__ import annotations

import pytest

from tests import wire
from tests.harness import Stack
from tests.integration.test_vision_engine import QUESTION, ask, image_part, png, reference

pytestmark = pytest.mark.multirank

# mlx-lm's gemma3 cannot be split over ranks; these text models can: Llama-style, Qwen3 with M-RoPE positions and
# DeepStack rows, Qwen3.5 with linear attention and M-RoPE on part of each head (Qwen2.5-VL's positions take Qwen3-VL's
# path, so it runs on one rank only, to keep CI short)
MODELS = ("mistral3-vision", "qwen3_vl-vision", "qwen3_5-vision")


@pytest.mark.parametrize("model", MODELS)
def test_two_ranks_answer_an_image_as_mlx_vlm_does(tmp_path, model):
    stack = Stack()
    engine = stack.start_engine(ranks=2, MODEL=f"zoo-{model}")
    try:
        info = wire.info(stack.socket)
        assert info.parallel == "tensor" and info.ranks == 2 and info.facts.vision
        data = png(5, 40, 64)
        expected, prompt_tokens = reference(model, data, tmp_path)
        turn = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}]
        tokens, finish = ask(stack, turn, "two-ranks-1")
        assert tokens == expected and finish.prompt_tokens == prompt_tokens
        follow = turn + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "More?"}]
        text, again = ask(stack, follow, "two-ranks-2")
        assert again.cached_tokens >= prompt_tokens - 2
        assert text == reference(model, data, tmp_path, follow)[0]
    finally:
        engine.stop()
