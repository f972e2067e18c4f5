"""Image tokens' ids (engine/vision/ids.py): the same picture keeps its ids, so the next turn of a conversation
reuses its KV; another picture of the same size gets other ids; and since those ids hold for one engine's life only,
a prompt with an image is kept in RAM but never written to the disk tier, where a restarted engine would read it as
another picture's."""

from __future__ import annotations

from engine.lockstep.results import StepResults
from engine.vision.ids import FIRST, ImageIds, has_images
from tests.unit.test_disk_index import EOS, opened, plan, scheduler, submit


def test_the_same_picture_keeps_its_ids_and_another_gets_others() -> None:
    ids = ImageIds()
    first = ids.ids("a" * 64, 16)
    assert first == list(range(FIRST, FIRST + 16))
    other = ids.ids("b" * 64, 16)
    assert not set(other) & set(first)
    assert ids.ids("a" * 64, 16) == first
    assert has_images([1, 2, *first]) and not has_images([1, 2, 3])


def test_a_forgotten_picture_gets_new_ids_never_a_remembered_ones() -> None:
    ids = ImageIds(remembered=2)
    a, b = ids.ids("a" * 64, 4), ids.ids("b" * 64, 4)
    ids.ids("c" * 64, 4)  # a is forgotten
    again = ids.ids("a" * 64, 4)
    assert again != a and not set(again) & set(b)


def test_a_prompt_with_an_image_is_never_named_for_the_disk_tier() -> None:
    sched = scheduler(opened())
    image = ImageIds().ids("a" * 64, 16)
    submit(sched, "a", [5, 6, *image, 7, 8], tenant="t")
    plan(sched)
    sched.absorb(StepResults(tokens=[("a", 5, None)]))
    sched.absorb(StepResults(tokens=[("a", EOS, "stop")]))
    (store,) = plan(sched).stores
    assert store.disk == ""  # kept in RAM only
