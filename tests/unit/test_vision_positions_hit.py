"""A next turn reusing an image's KV from the prefix cache, for a family whose image tokens take M-RoPE positions:
the plan leaves the image's features out but still carries its grid, since every token after the image sits where
the grid puts it (engine/vision/mrope.py); a family without a grid carries nothing for it. No MLX."""

from __future__ import annotations

from engine.lockstep.plan import ImageRows
from engine.vision.ids import FIRST, carried, needed

ROWS, COLUMNS = 6, 8
WITH_GRID = ImageRows(first=FIRST, rows=ROWS * COLUMNS, dtype="float32", data=bytes(ROWS * COLUMNS * 4 * 4),
                      grid=[ROWS, COLUMNS])
WITHOUT = ImageRows(first=FIRST + 100, rows=16, dtype="float32", data=bytes(16 * 4 * 4))
PROMPT = [1, 2] + list(range(FIRST, FIRST + ROWS * COLUMNS)) + list(range(FIRST + 100, FIRST + 116)) + [3, 4]


def test_an_image_wholly_in_the_reused_prefix_sends_its_grid_without_its_features():
    sent = needed([WITH_GRID, WITHOUT], PROMPT, len(PROMPT) - 2)
    assert [(i.first, i.grid, len(i.data)) for i in sent] == [(FIRST, [ROWS, COLUMNS], 0)]
    # the grid alone does not count as features: an insert whose entry is gone must not embed from it
    assert not carried(sent, PROMPT)


def test_an_image_the_new_tokens_reach_sends_its_features():
    sent = needed([WITH_GRID, WITHOUT], PROMPT, 10)
    assert [len(i.data) for i in sent] == [len(WITH_GRID.data), len(WITHOUT.data)]
    assert carried(sent, PROMPT)
