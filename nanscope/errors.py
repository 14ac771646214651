"""The one error hierarchy of nanscope and the exit codes it maps to.

Every failure a user can cause (a bad spec, a missing file, a factory that raises)
is a `NanscopeError`. The CLI turns it into one line on stderr and exit code 2;
anything else is a bug and keeps its traceback.
"""

import re
from collections.abc import Iterable
from typing import Any

EXIT_HEALTHY = 0
EXIT_PROBLEM = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130


class NanscopeError(Exception):
    """Bad input: reported as one line naming the file and field, exit code 2.

    Args:
        message: str. What is wrong, naming the file, the field and the value received.
        hint: str, optional. What to do about it.
    """

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"


class NonFiniteError(FloatingPointError):
    """Raised by `nanscope.instrument` at the first non-finite step: the message is the one-line diagnosis.

    Args:
        message: str. The diagnosis.
        report: TraceReport. The full report of the run so far.
    """

    exit_code = EXIT_PROBLEM

    def __init__(self, message: str, report: Any = None) -> None:
        super().__init__(message)
        self.report = report


class SpecError(NanscopeError):
    """The run spec does not parse or does not validate."""


class DataError(NanscopeError):
    """The data cannot be loaded or does not fit the model or the loss."""


class ModelError(NanscopeError):
    """The model cannot be loaded, built or called."""


# A printed array inside a message ("for input [[[1. 1.]\n  [1. 1.]]] with name ..."), which
# spans lines: it is replaced whole, so the line that says what went wrong stays whole.
_NUMBER = r"-?(?:\d[\d.eE+\-]*|nan|inf)"
_ARRAY_REPR = re.compile(rf"\s*(?:\[\[[\s\d.eE+\-\[\]naif]*\]\]|\[\s*{_NUMBER}(?:\s+{_NUMBER})+\s*\])\s*")


def first_line(exc: BaseException) -> str:
    """The line of an exception's text that says what went wrong, for a one-line message.

    Keras wraps errors raised inside a layer in a call header and ANSI bold; both are dropped,
    and an array the message prints is shown as `<array>`.
    """
    text = _ARRAY_REPR.sub(" <array> ", str(exc))
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", line).strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith("Exception encountered when calling")]
    return re.sub(r" +", " ", lines[0])[:300] if lines else type(exc).__name__


def did_you_mean(name: str, candidates: Iterable[str], cutoff: float = 0.6) -> str:
    """"; did you mean `x`?" for the known name closest to `name`, or "" when none is close.

    Args:
        name: str. What the user wrote.
        candidates: iterable of str. The known names.
        cutoff: float, default 0.6. How close a match must be (difflib's ratio).
    """
    import difflib

    matches = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=cutoff)
    return f"; did you mean `{matches[0]}`?" if matches else ""
