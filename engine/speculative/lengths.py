"""How many draft tokens rank 0 asks for per sequence: each sequence's next draft length follows its last verdict.

Every row of a verify pass is as wide as the batch's widest draft, so a long draft that is mostly rejected costs
every row of the batch positions that emit nothing. The rule: all accepted -> double (up to NUM_DRAFT_TOKENS); some
rejected -> one past what was accepted; none accepted -> halve (down to 1), and after REST_AFTER such rounds in a
row the sequence is not proposed for for 1, 2, 4... rounds (at most MAX_REST), as dry proposals send plans ahead.
Free of MLX; rank 0 only (the lengths reach the other ranks as the drafts in the plan).
"""

from __future__ import annotations

START_TOKENS = 4  # a new sequence's first draft: copy-heavy answers reach NUM_DRAFT_TOKENS in a few steps
REST_AFTER = 3  # rounds in a row with no draft token accepted before a sequence rests
MAX_REST = 8  # at most this many rounds of proposals without it


class DraftLengths:
    """Per sequence: the length of its next draft, and the rounds it still rests."""

    def __init__(self, cap: int):
        self.cap = cap
        self.start = min(cap, START_TOKENS)
        self.length: dict[str, int] = {}
        self.misses: dict[str, int] = {}  # consecutive verdicts that kept none of its drafts
        self.resting: dict[str, int] = {}  # rounds of proposals it still sits out

    def take(self, rid: str) -> int:
        """The draft length to ask for this round (0: it rests, and one round of its rest is spent)."""
        rest = self.resting.get(rid, 0)
        if rest:
            self.resting[rid] = rest - 1
            return 0
        return self.length.get(rid, self.start)

    def judged(self, rid: str, drafted: int, accepted: int) -> None:
        """The step verified `drafted` draft tokens of rid's and kept `accepted` of them."""
        if drafted <= 0:
            return
        if accepted >= drafted:
            self.length[rid] = min(2 * drafted, self.cap)
        elif accepted > 0:
            self.length[rid] = min(accepted + 1, self.cap)
        else:
            self.length[rid] = max(1, drafted // 2)
            misses = self.misses[rid] = self.misses.get(rid, 0) + 1
            if misses >= REST_AFTER:
                self.resting[rid] = min(2 ** (misses - REST_AFTER), MAX_REST)
            return
        self.misses.pop(rid, None)

    def forget(self, rid: str) -> None:
        for kept in (self.length, self.misses, self.resting):
            kept.pop(rid, None)
