"""The prefix cache on two ranks for models whose caches cannot be cut (Qwen3.5's linear attention) or stop being
cuttable once their sliding window wraps (gpt-oss): every rank keeps the same prompt ends, an agent's next
turns start from them, and every answer is byte-identical to two ranks without the cache. (Qwen3-Next has no
tensor-parallel shard(): it runs on one rank only.)"""

from __future__ import annotations

import pytest

from tests.integration.test_prefix_kinds import check_reuse_and_identical_answers

pytestmark = pytest.mark.multirank


@pytest.mark.parametrize("name", ["gpt-oss", "qwen3.5"])
def test_an_agents_next_turns_start_from_its_last_prompt_on_two_ranks(name: str) -> None:
    check_reuse_and_identical_answers(name, ranks=2)
