"""Client text stays text: a special token's string inside a message, a tool result or a tool schema
tokenises as plain text, so typed <|im_end|><|im_start|>system cannot forge a turn; the chat template's
own markers stay special.

Before rendering, each special string in a client string becomes a mark (MARK and one private-use
character naming the token); after rendering, the text between two of the template's own special tokens
that holds a mark is encoded with special tokens read as text. Replacing (rather than wrapping) the
string means no template transform (strip, split, slicing) can bring the special text back into the
template's part of the prompt. A prompt whose client strings hold no special string is rendered and
encoded exactly as before: same ids, same prefix-cache keys.
"""

from __future__ import annotations

import copy
import re
from typing import Any, Callable

from engine import mlx_compat
from engine.rank0.errors import Refused

MARK = "\ue000"  # opens every mark; a client's own MARK is written MARK MARK
FIRST = 0xF0000  # MARK + chr(FIRST + i) stands for the text of special token i (planes 15-16)
MAX_SPECIALS = 0x110000 - FIRST
_MARKS = re.compile(MARK + "(.)", re.DOTALL)


class ClientText:
    """The tokenizer's special strings, and how to encode a chat whose client strings held some."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        hf = mlx_compat.hf_tokenizer(tokenizer)
        added = getattr(hf, "added_tokens_decoder", {}) or {}
        specials = {tid: t.content for tid, t in added.items() if getattr(t, "special", False) and t.content}
        self.specials = sorted(set(specials.values()))[:MAX_SPECIALS]
        # <unk> stands for text the vocabulary lacks: from plain text it is no forged marker
        self.special_ids = frozenset(specials) - {getattr(hf, "unk_token_id", None)}
        self._code = {s: MARK + chr(FIRST + i) for i, s in enumerate(self.specials)}
        self._find = re.compile(trie_pattern(self.specials)) if self.specials else None
        self._hf = hf
        self._text_hf: Any = None  # a private copy that reads special strings as text, made on first need
        self._framing: tuple[list[int], list[int]] | None = None
        self._context: bool | None = None

    # ------------------------------------------------------------ before rendering

    def marked(self, messages: list[Any], tools: list[Any] | None) -> tuple[list[Any], list[Any] | None] | None:
        """messages and tools with every special string in their strings (keys too) replaced by its mark,
        or None when no string holds one: the chat is then rendered and encoded as it always was."""
        if self._find is None or not self._holds_special([messages, tools]):
            return None
        return _mapped(messages, self._mark), _mapped(tools, self._mark)

    def _holds_special(self, value: Any) -> bool:
        stack = [value]  # iterative: a deep client value must not end the walk in a RecursionError
        while stack:
            v = stack.pop()
            if isinstance(v, str):
                if self._find.search(v):  # type: ignore[union-attr]
                    return True
            elif isinstance(v, dict):
                stack.extend(v.keys())
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)
        return False

    def _mark(self, text: str) -> str:
        escaped = text.replace(MARK, MARK + MARK)
        return self._find.sub(lambda m: self._code[m.group()], escaped)  # type: ignore[union-attr]

    # ------------------------------------------------------------ after rendering

    def encode(self, rendered: str, add_special_tokens: bool) -> list[int]:
        """The ids of a chat rendered from marked input: the template's special tokens as tokens, each
        stretch between two of them that holds a client's special string encoded as text."""
        assert self._find is not None
        ids: list[int] = []
        plain: list[str] = []  # text encoded as usual, kept whole so its ids match an unmarked encoding

        def flush() -> None:
            if plain:
                ids.extend(self.tokenizer.encode("".join(plain), add_special_tokens=False))
                plain.clear()

        pos = 0
        for m in [*self._find.finditer(rendered), None]:
            stretch = rendered[pos:m.start() if m else len(rendered)]
            text, holds_special = self._unmark(stretch)
            if holds_special:
                flush()
                ids.extend(self._as_text(text, at_start=not ids))
            else:
                plain.append(text)
            if m:
                plain.append(m.group())
                pos = m.end()
        flush()
        if add_special_tokens:
            before, after = self._framing_ids()
            ids = before + ids + after
        return ids

    def _unmark(self, stretch: str) -> tuple[str, bool]:
        """stretch with its marks back to the client's text, and whether a special string was among them."""
        found = False

        def back(m: re.Match[str]) -> str:
            nonlocal found
            ch = m.group(1)
            if ch == MARK:
                return MARK
            i = ord(ch) - FIRST
            if 0 <= i < len(self.specials):
                found = True
                return self.specials[i]
            return m.group()  # half a mark a template cut off: the client's text, as it stands

        return _MARKS.sub(back, stretch), found

    def _as_text(self, text: str, at_start: bool) -> list[int]:
        encode = self._text_encoder()
        ids = encode(text)
        if not at_start and self._needs_context():
            # a SentencePiece-like tokenizer adds a prefix space at the start of a string but not after a
            # special token: encode after a newline and drop it again (transformers does the same)
            newline = encode("\n")
            after = encode("\n" + text)
            if after[:len(newline)] == newline:
                ids = after[len(newline):]
        if self.special_ids.intersection(ids):
            shown = next((repr(s) for s in self.specials if s in text), "text")
            raise Refused(f"the messages contain {shown}, the text of one of this model's special tokens, which "
                          "its tokenizer cannot encode as plain text; remove it", "messages")
        return ids

    def _text_encoder(self) -> Callable[[str], list[int]]:
        # A private copy: transformers keeps split_special_tokens as state on the shared backend, and a
        # concurrent ordinary encode must never see it set.
        if self._text_hf is None:
            self._text_hf = copy.deepcopy(self._hf)
        hf = self._text_hf
        return lambda s: list(hf.encode(s, add_special_tokens=False, split_special_tokens=True))

    def _needs_context(self) -> bool:
        """Whether text encoded alone differs from the same text after a special token."""
        if self._context is None:
            s, word = self.specials[0], "Hello world"
            enc = self.tokenizer.encode
            self._context = enc(s + word, add_special_tokens=False) != (
                enc(s, add_special_tokens=False) + enc(word, add_special_tokens=False))
        return self._context

    def _framing_ids(self) -> tuple[list[int], list[int]]:
        """The ids add_special_tokens puts before and after a text (a BOS, an EOS)."""
        if self._framing is None:
            core = self.tokenizer.encode("a", add_special_tokens=False)
            full = self.tokenizer.encode("a", add_special_tokens=True)
            at = next((i for i in range(len(full) - len(core) + 1) if full[i:i + len(core)] == core), len(full))
            self._framing = (full[:at], full[at + len(core):])
        return self._framing


def _mapped(value: Any, fn: Callable[[str], str]) -> Any:
    """value with fn applied to every string, dict keys included."""
    if isinstance(value, str):
        return fn(value)
    if isinstance(value, dict):
        return {(fn(k) if isinstance(k, str) else k): _mapped(v, fn) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mapped(v, fn) for v in value]
    return value


def trie_pattern(words: list[str]) -> str:
    """A regex matching any of words, longest first, factored by common prefixes: a client's text of a
    thousand near-misses (<|reserved_special_token_x) costs one pass, not one per word."""
    trie: dict[str, Any] = {}
    for w in words:
        node = trie
        for ch in w:
            node = node.setdefault(ch, {})
        node[""] = {}

    def walk(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + walk(child) for ch, child in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return walk(trie)
