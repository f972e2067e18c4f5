"""States at the boundaries a later prompt extends, taken in the step they exist and held until a plan stores them.

For a model whose prefix cache entries cannot be cut (engine/lockstep/cuts.py), an entry must end exactly where a
later prompt goes on: just before a prompt's last token (a next turn extends the prompt, not the answer as sampled,
and the same prompt again computes only that token) and where prompts of several conversations part (the end of a
shared system prompt and tools). Rank 0 names those in the insert (Insert.keep_prompt, Insert.keep_at), mlx-lm's
BatchGenerator pauses there (it feeds a prompt's last token as a segment of its own, and a prompt's segments end
where keep_at splits it), and every rank copies the state in the same step.
Rank 0 learns that the prompt was prefilled from its first token and stores what it wants in a later plan.
"""

from __future__ import annotations

import logging
from typing import Any

from engine import mlx_compat

log = logging.getLogger(__name__)

# Plans a state is held once taken: the prompt's last token is fed one step later and the first token comes back
# the step after, and with several ranks rank 0 makes its plans one step ahead (engine/leader.py), so its
# store comes in the fourth plan at the latest; two more for margin. The engine going idle lets go of the rest.
PLANS_HELD = 6


class Boundaries:
    """Token counts each sequence is to be copied at, and the copies held for rank 0's stores."""

    def __init__(self) -> None:
        self.wanted: dict[str, list[int]] = {}  # rid -> token counts not yet reached, ascending
        self.held: dict[tuple[str, int], list] = {}  # (rid, tokens) -> [cache, plans left]

    def want(self, rid: str, lengths: list[int]) -> None:
        if lengths:
            self.wanted[rid] = sorted(set(lengths))

    def forget(self, rid: str) -> None:
        """The sequence has gone: what it reached ages out."""
        self.wanted.pop(rid, None)

    def clear(self) -> None:
        self.wanted.clear()
        self.held.clear()

    def take(self, gen: Any, uid_of: dict[str, int]) -> None:
        """After a step: copy each sequence that has fed exactly a wanted count of tokens."""
        fed = mlx_compat.fed_tokens(gen)
        for rid, lengths in list(self.wanted.items()):
            n = fed.get(uid_of.get(rid, -1))
            if n is None:
                continue
            while lengths and lengths[0] < n:  # passed without a pause: nothing to copy there
                lengths.pop(0)
            if lengths and lengths[0] == n:
                lengths.pop(0)
                uid = uid_of[rid]
                try:
                    cache, tokens = gen.extract_cache([uid])[uid]
                except Exception:  # the same on every rank: the entry is missing everywhere, and rank 0 forgets it
                    log.exception("request %s: its state at %d tokens could not be copied", rid, n)
                else:
                    self.held[(rid, n)] = [cache, PLANS_HELD]
            if not lengths:
                del self.wanted[rid]

    def pop(self, rid: str, length: int) -> Any | None:
        """The state of rid at exactly `length` tokens, for a store (once)."""
        held = self.held.pop((rid, length), None)
        return None if held is None else held[0]

    def age(self) -> None:
        """A plan has been applied: states of sequences done with their prompt, not stored in time, go."""
        for key in list(self.held):
            if key[0] not in self.wanted:
                self.held[key][1] -= 1
                if self.held[key][1] <= 0:
                    del self.held[key]
