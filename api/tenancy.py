"""Whose prefix cache a request may use: one per API key when the gateway accepts several.

The engine's prefix cache reports how many prompt tokens a request found cached (OpenAI's `cached_tokens`,
Anthropic's `cache_read_input_tokens`); shared across keys, that count would tell one key whether another
key's prompts began with a guess. RequireAPIKey puts the accepted key's salt here for the request's task, and
the engine client stamps it on every Generate; with no key or a single key everything is shared as before.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar

import msgspec

import ipc

_salt: ContextVar[str] = ContextVar("cache_salt", default="")


def salt_for(key_digest: bytes) -> str:
    """The salt of one accepted key (from its SHA-256): stable across API restarts, and not the key."""
    return hashlib.sha256(b"mlx-cluster-serve prefix cache\0" + key_digest).hexdigest()[:32]


def set_salt(salt: str) -> None:
    """For the current request's task and those it starts."""
    _salt.set(salt)


def salted(msg: ipc.Generate) -> ipc.Generate:
    """msg with the current request's cache salt, unless it carries one already."""
    salt = _salt.get()
    if not salt or msg.cache_salt:
        return msg
    return msgspec.structs.replace(msg, cache_salt=salt)
