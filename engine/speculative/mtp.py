"""The mtp proposer: drafts from the target's own multi-token-prediction heads (engine/mtp), else a refusal.

Every rank holding the heads runs them at the end of each step (engine/speculative/mtp_model.py): under tensor
parallel every rank, their layers sharded like the main model's so that their all_sums meet; under pipeline the
last stage alone, which is rank 0 (mlx-lm's pipeline() gives it the last layers: engine.parallel.holds_heads). The
batch keeps the drafts by request id; rank 0's proposer only hands them out with the next plan, where they travel
and are verified as ngram's and a draft model's are, so no other collective carries them.
A checkpoint without heads, or a family engine/mtp does not cover, is refused at `check` and start in the
sentence engine.mtp derives from the weights found.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from config import Settings
from engine.model import LoadedModel, ModelError


def mtp_refusal(folder: Path) -> str | None:
    """Why SPECULATIVE=mtp cannot run on this model folder (`launch.sh check` and start), None when it can."""
    from engine.mtp import heads_refusal

    return heads_refusal(Path(folder))


class MtpProposer:
    """Rank 0: the drafts the batch's last step chained for each sequence, while they follow its history."""

    def __init__(self, settings: Settings, loaded: LoadedModel) -> None:
        if not hasattr(loaded.model, "chain"):  # the engine wraps the model at load where the heads load
            raise ModelError(mtp_refusal(Path(loaded.path)) or
                             f"SPECULATIVE=mtp cannot run on MODEL={settings.MODEL}: its heads were not loaded")
        self.batch: Any = None

    def read_from(self, batch: Any) -> None:
        self.batch = batch

    def propose(self, histories: dict[str, list[int]], k: int) -> dict[str, list[int]]:
        chained = self.batch.mtp_drafts if self.batch is not None else {}
        out = {}
        for rid, history in histories.items():
            drafts = chained.get(rid)
            if drafts and history and drafts[0] == history[-1]:  # they follow the input the step will feed
                out[rid] = drafts[1:1 + k]
        return out

    def forget(self, rid: str) -> None:
        pass
