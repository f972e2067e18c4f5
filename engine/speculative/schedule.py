"""Rank 0's drafting schedule: which sequences get drafts in a plan, and whether the next plan is made after the
step (so drafts can continue its tokens) or sent ahead of it. Free of MLX: it sees the batch only through the
histories it is handed, so unit tests drive it with plain token lists."""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from engine.lockstep.plan import Plan
from engine.speculative.lengths import DraftLengths
from engine.speculative.propose import Proposer

log = logging.getLogger(__name__)

# With a proposer and several ranks: after a round of proposals that found nothing, the next 1, 2, 4... plans (at
# most this many) are sent ahead again, undrafted, so plain chat keeps the overlap of plan and forward pass.
MAX_PLANS_AHEAD = 8


class DraftSchedule:
    """Drafts for the plans rank 0 makes, and when the next plan travels."""

    def __init__(self, proposer: Proposer, draft_tokens: int, beat: Callable[[str], None] = lambda what: None):
        self.proposer = proposer
        self.draft_tokens = draft_tokens  # at most this many per sequence
        self.lengths = DraftLengths(draft_tokens)  # each sequence's next draft length, from its last verdict
        self.beat = beat  # the watchdog's: proposing may take a while (a draft model's forward passes)
        self.dry_rounds = 0  # consecutive rounds of proposals that found no draft
        self.plans_ahead = 0  # plans still to send ahead before proposing again

    def speculate(self, plan: Plan, after: bool, histories: Callable[[], dict[str, list[int]]],
                  left: Callable[[], dict[str, int]] = dict) -> Plan:
        """Drafts for a plan made after the step, and how the next plan travels: after this step while proposals
        find drafts (or a sequence joins), else sent ahead for a few plans before proposing again.

        histories: the batch's decoding sequences (each one's tokens, last its next input), asked only when needed.
        left: the tokens each sequence in the batch may still gain (max_tokens less those it has), asked only
        when the next plan comes after the step; {} when not known (every sequence may draft).
        """
        for rid in plan.removes:  # the sequences that finish in a step are forgotten after it (Leader._count_drafts)
            self.forget(rid)
        decoding = self._decoding(plan, histories()) if after else {}
        drafts = self._drafts(plan, decoding) if decoding else {}
        if plan.inserts:
            self.dry_rounds = self.plans_ahead = 0
        elif decoding:  # a round of proposals (none while every sequence still prefills)
            self.dry_rounds = 0 if drafts else self.dry_rounds + 1
            self.plans_ahead = min(2 ** (self.dry_rounds - 1), MAX_PLANS_AHEAD) if self.dry_rounds else 0
        elif not after:
            self.plans_ahead = max(0, self.plans_ahead - 1)
        log.debug("plan %d, made %s the step: drafts for %d sequence(s), the next plan %s", plan.step,
                  "after" if after else "ahead of", len(drafts), "after" if self.plans_ahead == 0 else "ahead")
        next_after = self.plans_ahead == 0
        return msgspec.structs.replace(plan, drafts=drafts, next_after=next_after,
                                       chain=next_after and _may_draft_next(plan, left()))

    @staticmethod
    def _decoding(plan: Plan, histories: dict[str, list[int]]) -> dict[str, list[int]]:
        """The sequences that decode in this plan's step: never one it removes (one still prefilling has no
        history: it has no next input yet)."""
        gone = set(plan.removes)
        return {rid: h for rid, h in histories.items() if rid not in gone}

    def judged(self, drafts: dict[str, list[int]], tokens: list[tuple[str, int, str | None]], drafted: set[str]) -> None:
        """A step verified the plan's drafts: tokens are what each sequence gained (its fed input, then the drafts
        it kept), drafted the sequences whose drafts it judged."""
        gained: dict[str, int] = {}
        for rid, _, _ in tokens:
            gained[rid] = gained.get(rid, 0) + 1
        for rid in drafted:
            if rid in drafts and rid in gained:
                self.lengths.judged(rid, len(drafts[rid]), gained[rid] - 1)

    def forget(self, rid: str) -> None:
        """The sequence left the batch."""
        self.proposer.forget(rid)
        self.lengths.forget(rid)

    def _drafts(self, plan: Plan, histories: dict[str, list[int]]) -> dict[str, list[int]]:
        self.beat(f"proposing drafts for plan {plan.step}")
        by_length: dict[int, dict[str, list[int]]] = {}  # one proposal call per length (a draft model's passes)
        for rid, history in histories.items():
            k = self.lengths.take(rid)
            if k > 0:
                by_length.setdefault(k, {})[rid] = history
        drafts = {}
        for k, group in by_length.items():
            proposed = self.proposer.propose(group, k)
            drafts.update({rid: list(d[:k]) for rid, d in proposed.items() if d and rid in group})
        width = batch_width([len(d) for d in drafts.values()], len(histories))
        return {rid: d[:width] for rid, d in drafts.items()} if width else {}


def _may_draft_next(plan: Plan, left: dict[str, int]) -> bool:
    """Whether a sequence may get drafts in the plan after this one: this step gains it at least one token, and
    drafts are cut at one short of max_tokens (engine/speculative/verify.py), so one with 2 or fewer left gets none."""
    gone = set(plan.removes)
    return not left or any(n > 2 for rid, n in left.items() if rid not in gone)


def batch_width(lengths: list[int], rows: int) -> int:
    """The widest draft a batch of `rows` decoding rows pays for: the verify pass computes every row that wide, so
    a width is kept only while drafts fill at least half the positions it adds (one drafting row of eight: none)."""
    for width in range(max(lengths, default=0), 0, -1):
        if 2 * sum(min(n, width) for n in lengths) >= rows * width:
            return width
    return 0
