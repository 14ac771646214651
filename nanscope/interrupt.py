"""Ctrl-C and SIGTERM, remembered: a stop request that cannot be lost.

Python raises KeyboardInterrupt wherever the main thread happens to be; if that is
inside a `__del__` (TensorFlow frees traced functions that way) the exception is
printed and dropped, and the run would go on. The handler therefore also sets a
flag, and every training loop checks it between steps.
"""

import signal
import sys

_requested = False
_default_unraisable = sys.unraisablehook


def install():
    """Route SIGINT and SIGTERM to `request`; keep dropped interrupts out of the user's terminal."""
    signal.signal(signal.SIGINT, request)
    signal.signal(signal.SIGTERM, request)
    if sys.unraisablehook is not _quiet_unraisable:
        global _default_unraisable
        _default_unraisable = sys.unraisablehook
        sys.unraisablehook = _quiet_unraisable


def _quiet_unraisable(info):
    # The stop request is already remembered: its lost KeyboardInterrupt is no news.
    if info.exc_type is KeyboardInterrupt and _requested:
        return
    _default_unraisable(info)


def request(signum=None, frame=None):
    """Remember the stop request and raise KeyboardInterrupt."""
    global _requested
    _requested = True
    raise KeyboardInterrupt


def requested():
    """True once SIGINT or SIGTERM has arrived."""
    return _requested


def check():
    """Raise KeyboardInterrupt if a stop was requested, even one whose exception got lost."""
    if _requested:
        raise KeyboardInterrupt
