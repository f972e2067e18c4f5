"""Ctrl-C, TERM and HUP during a start or a restart-api's hand-over: Interrupted, so that the command undoes
what it began; a step that must be done whole (a process started and its pid file written) defers it.

No signal mask: a handler only notes a signal while a step runs, and raises once the step is done. A
mask would be inherited by every process started meanwhile and only covers one thread, and CPython runs
pending handlers inside the very call that sets or lifts it.
"""

from __future__ import annotations

import contextlib
import signal

# The signals that end a command run by hand (a terminal closed, an ssh session dropped: SIGHUP).
ENDING_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(Exception):
    """SIGINT, SIGTERM or SIGHUP (the terminal closed, the ssh session dropped) during a start or a
    restart-api's hand-over."""


class _Guard:
    """What an ending signal does now. Plain attributes: the handler runs between two bytecodes of the
    main thread, so each read or write of one is whole."""

    armed = False  # inside interruptible() and not yet interrupted: a signal raises Interrupted
    deferring = 0  # deferred() blocks under way: a signal is only noted until the last one ends
    holding = 0  # held() blocks under way: a signal noted in one outlives the interruptible() blocks inside
    pending = False  # a signal was noted


_guard = _Guard()


def _on_signal(signum, frame) -> None:
    if _guard.armed and not _guard.deferring:
        _guard.armed = False  # once: the undoing that follows runs to its end, later signals are only noted
        raise Interrupted
    _guard.pending = True


def handle(handler, previous: dict) -> None:
    """Install handler for the ending signals but those already ignored (under nohup a hangup must stay
    without effect), noting in previous, as it goes, what to restore."""
    for sig in ENDING_SIGNALS:
        if signal.getsignal(sig) != signal.SIG_IGN:
            previous[sig] = signal.signal(sig, handler)


def restore(previous: dict) -> None:
    for sig, old in previous.items():
        signal.signal(sig, old)


@contextlib.contextmanager
def interruptible():
    """An ending signal in the block raises Interrupted (once), so the command can undo what it began. Inside
    held(), one noted before the block raises as it begins: what follows a stop it interrupted never starts."""
    _guard.armed = False
    if not _guard.holding:
        _guard.pending = False
    previous: dict = {}
    try:
        handle(_on_signal, previous)  # disarmed while installing: a signal meanwhile is noted
        _guard.armed = True
        if _guard.pending and not _guard.deferring:
            _guard.armed = False
            raise Interrupted
        yield
    finally:
        # Disarmed before restoring (signal.signal runs pending handlers): a signal as the block ends is
        # noted, never raised where nothing catches it.
        _guard.armed = False
        restore(previous)
        if not _guard.holding:
            _guard.pending = False


@contextlib.contextmanager
def held():
    """A part done whole whatever comes (a stop): an ending signal is only noted (see noted()), and kept
    for the rest of the command: an interruptible() inside raises it as it begins."""
    previous: dict = {}
    if not _guard.holding:
        _guard.pending = False
    _guard.holding += 1
    try:
        handle(_on_signal, previous)
        yield
    finally:
        restore(previous)
        _guard.holding -= 1
        if not _guard.holding:
            _guard.pending = False


def noted() -> bool:
    """True once an ending signal came during the held() block under way."""
    return _guard.pending


@contextlib.contextmanager
def deferred():
    """A step done whole or not at all: an ending signal during the block waits for its end, and then (still
    inside interruptible()) raises Interrupted. Outside interruptible() it changes nothing."""
    _guard.deferring += 1
    try:
        yield
    finally:
        _guard.deferring -= 1
        if _guard.pending and _guard.armed and not _guard.deferring:
            _guard.armed = False
            raise Interrupted
