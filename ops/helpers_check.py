"""Can the helper models (EMBEDDING_MODEL, RERANK_MODEL) load? Asked before `launch.sh start` and in `launch.sh
check`; the answer comes from `python -m engine.helpers.preflight` in a child process (ops never imports MLX)."""

from __future__ import annotations

from config import Settings
from ops.verdict import child_refusal

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}

VERDICT_TIMEOUT = 120  # seconds: importing mlx-lm, and generating a zoo helper on first use


def helper_refusal(settings: Settings) -> str | None:
    """The sentence saying why a helper setting cannot load; None when it can, when none is set (no child process),
    or when this host cannot tell."""
    if not (settings.EMBEDDING_MODEL.strip() or settings.RERANK_MODEL.strip()) or not helper_host_is_here(settings):
        return None
    return child_refusal(["-m", "engine.helpers.preflight"], VERDICT_TIMEOUT)


def helper_host_is_here(settings: Settings) -> bool:
    """Whether the helpers load on this host (HELPER_RANK is rank 0's host or one of its local ranks): the preflight
    resolves their folders here; another host's rank refuses a helper it cannot load at start, in the same sentence."""
    k = settings.HELPER_RANK
    if k == 0:
        return True
    if settings.HOSTFILE or k >= len(settings.hosts):
        return False
    return settings.hosts[k] in LOCAL_HOSTS or settings.hosts[k] == settings.hosts[0]
