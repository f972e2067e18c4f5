"""Prompt lookup: propose what followed the most recent earlier occurrence of a sequence's last few tokens.

Answers that copy from their prompt (a file being edited, a diff, a quoted passage) continue the way the copied
text did; finding the sequence's last n tokens earlier in its history predicts the next ones for free. The
longest match wins (n from MAX_N down to MIN_N), and among equal matches the most recent, which tracks what the
answer is copying now. A continuation that reaches the end of the history goes on with its own proposals, so a
text repeating with a short period is proposed whole.

Rank 0 asks every step for every decoding sequence, so each sequence keeps an index, built once from its prompt
and grown by the tokens it gained since: n-gram -> where its most recent occurrence ended, for every n-gram that
ends before the history's last token (the last n-gram must find an *earlier* occurrence, not itself).
"""

from __future__ import annotations

MAX_N = 4
MIN_N = 2


class _Index:
    """One sequence's n-grams, as far as its history has been read."""

    __slots__ = ("tokens", "ends")

    def __init__(self) -> None:
        self.tokens: list[int] = []  # the history read so far (a copy: the caller's list may change)
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> position just after its most recent occurrence

    def extend(self, history: list[int], max_n: int, min_n: int) -> None:
        """Read the tokens the history gained; every n-gram ending before its last token is indexed."""
        tokens, ends = self.tokens, self.ends
        start = len(tokens)
        tokens.extend(history[start:])
        # n-grams ending at `end` (exclusive) for end up to len - 1: the one ending at the last token is the query
        for end in range(max(start, 1), len(tokens)):
            for n in range(min_n, max_n + 1):
                if end >= n:
                    ends[tuple(tokens[end - n:end])] = end

    def propose(self, k: int, max_n: int, min_n: int) -> list[int]:
        tokens, size = self.tokens, len(self.tokens)
        for n in range(min(max_n, size - 1), min_n - 1, -1):
            at = self.ends.get(tuple(tokens[size - n:]))
            if at is None:
                continue
            out: list[int] = []
            for j in range(k):  # past the history's end, the continuation copies what it proposed already
                i = at + j
                out.append(tokens[i] if i < size else out[i - size])
            return out
        return []


class NgramProposer:
    """The `ngram` proposer (SPECULATIVE=ngram): no model, deterministic, rank 0 only."""

    def __init__(self, max_n: int = MAX_N, min_n: int = MIN_N):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes must satisfy 1 <= min_n <= max_n (got {min_n}, {max_n})")
        self.max_n, self.min_n = max_n, min_n
        self.indexes: dict[str, _Index] = {}

    def propose(self, histories: dict[str, list[int]], k: int) -> dict[str, list[int]]:
        out = {}
        for rid, history in histories.items():
            index = self.indexes.get(rid)
            if index is None or not _continues(index.tokens, history):
                index = self.indexes[rid] = _Index()  # new, or not the sequence indexed under this id before
            index.extend(history, self.max_n, self.min_n)
            drafts = index.propose(k, self.max_n, self.min_n) if k > 0 else []
            if drafts:
                out[rid] = drafts
        return out

    def forget(self, rid: str) -> None:
        self.indexes.pop(rid, None)


def _continues(seen: list[int], history: list[int]) -> bool:
    """Whether history extends what was read (checked at its ends and middle: a sequence only ever grows)."""
    n = len(seen)
    if n > len(history):
        return False
    return n == 0 or (history[n - 1] == seen[-1] and history[0] == seen[0] and history[n // 2] == seen[n // 2])
