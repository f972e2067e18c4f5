"""Vision-language models on two real ranks: rank 0 alone runs the tower, the features travel in the plan, and both
ranks' prefill reads them, so an image request answers with mlx-vlm's own greedy tokens (as one rank does) and a
second turn with the same image reuses the first's KV on every rank. Each family and parallel mode once: Mistral 3
in tensor parallel (CI_SLOW=1), in pipeline parallel with prompt lookup drafting (its drafts copy the prompt's image
tokens),
Gemma 3 in tensor parallel (its text model sharded by engine/shard_gemma3.py), and in tensor parallel the Qwen families
whose image tokens take M-RoPE positions: Qwen3-VL (DeepStack rows on every rank) and Qwen3.5 (linear attention).
Qwen2.5-VL's positions take Qwen3-VL's path, so it runs on one rank only, to keep CI short. The second turn answers
as mlx-vlm does too (for M-RoPE: its tokens sit past the image's positions on every rank)."""

from __future__ import annotations

import pytest

from tests import wire
from tests.harness import Stack
from tests.integration.test_vision_engine import QUESTION, ask, image_part, png, reference

pytestmark = pytest.mark.multirank

# Mistral 3 in tensor parallel takes the path Gemma 3's run takes, and its family runs pipelined: CI_SLOW=1 runs it
RUNS = [pytest.param("mistral3-vision", "tensor", {}, marks=pytest.mark.slow),
        ("mistral3-vision", "pipeline", {"PARALLEL": "pipeline", "SPECULATIVE": "ngram"}),
        ("gemma3-vision", "tensor", {}), ("qwen3_vl-vision", "tensor", {}), ("qwen3_5-vision", "tensor", {})]

IDS = [f"{m}-{p}" for m, p, _ in (getattr(run, "values", run) for run in RUNS)]


@pytest.mark.parametrize(("model", "parallel", "settings"), RUNS, ids=IDS)
def test_two_ranks_answer_an_image_as_mlx_vlm_does(tmp_path, model, parallel, settings):
    stack = Stack()
    engine = stack.start_engine(ranks=2, MODEL=f"zoo-{model}", **settings)
    try:
        info = wire.info(stack.socket)
        assert info.parallel == parallel and info.ranks == 2 and info.facts.vision
        data = png(5, 40, 64)
        expected, prompt_tokens = reference(model, data, tmp_path)
        turn = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image_part(data)]}]
        tokens, finish = ask(stack, turn, "two-ranks-1")
        assert tokens == expected and finish.prompt_tokens == prompt_tokens
        follow = turn + [{"role": "assistant", "content": "A picture."}, {"role": "user", "content": "More?"}]
        text, again = ask(stack, follow, "two-ranks-2")
        assert again.cached_tokens >= prompt_tokens - 2  # the image's features were not sent again (a KeyError)
        assert text == reference(model, data, tmp_path, follow)[0]
        assert wire.info(stack.socket).spec_mode == settings.get("SPECULATIVE", "off")
    finally:
        engine.stop()
