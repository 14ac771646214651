"""Ctrl-C and SIGTERM, remembered: a stop request that cannot be lost.

Python raises KeyboardInterrupt wherever the main thread happens to be; if that is
inside a `__del__` (TensorFlow frees traced functions that way) the exception is
printed and dropped, and the run would go on. The handler therefore also sets a
flag, and every training loop checks it between steps.
"""

import contextlib
import signal
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

_requested = False
_deferring = False
_default_unraisable = sys.unraisablehook


def install() -> None:
    """Route SIGINT and SIGTERM to `request`, forgetting an earlier command's stop request (a notebook or a
    test process runs many commands: one Ctrl-C must not stop every later run at step 0); keep dropped
    interrupts out of the user's terminal."""
    global _deferring, _requested
    _deferring = False
    _requested = False
    signal.signal(signal.SIGINT, request)
    signal.signal(signal.SIGTERM, request)
    if sys.unraisablehook is not _quiet_unraisable:
        global _default_unraisable
        _default_unraisable = sys.unraisablehook
        sys.unraisablehook = _quiet_unraisable


def _quiet_unraisable(info: Any) -> None:
    # The stop request is already remembered: its lost KeyboardInterrupt is no news.
    if info.exc_type is KeyboardInterrupt and _requested:
        return
    _default_unraisable(info)


def request(signum: int | None = None, frame: FrameType | None = None) -> None:
    """Remember the stop request; raise KeyboardInterrupt unless one was raised already or raising is deferred."""
    global _requested
    del signum, frame  # Unused: the signal handler's arguments
    first = not _requested
    _requested = True
    if first and not _deferring:
        raise KeyboardInterrupt


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Finish the block (writing the report) even if a signal arrives; the request is still remembered."""
    global _deferring
    previous, _deferring = _deferring, True
    try:
        yield
    finally:
        _deferring = previous


def defer_from_now() -> None:
    """Defer every later signal until the next `install()`: the command is writing what it found."""
    global _deferring
    _deferring = True


def requested() -> bool:
    """True once SIGINT or SIGTERM has arrived."""
    return _requested


def check() -> None:
    """Raise KeyboardInterrupt if a stop was requested, even one whose exception got lost."""
    if _requested:
        raise KeyboardInterrupt
