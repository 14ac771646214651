"""Finishing a report without losing the run: a part that fails is left out and named.

A run that trained for minutes has earned its report. Validation, `--verify`, a
plot or a rule that raises while the report is finished is a nanscope bug (or a
broken optional dependency), not a verdict on the user's training: that part is
left out, a note in the report names it, and the JSON and the exit code stand.

Example:
    with optional_part(report.notes, "the plot"):
        plot_trace(report, path)
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)


@contextmanager
def optional_part(notes: list[str], part: str) -> Iterator[None]:
    """Run the body; if it raises, append a note naming `part` to `notes` and carry on.

    Ctrl-C (KeyboardInterrupt) and SystemExit still propagate: they are not failures.
    The traceback goes to the `nanscope` logger at debug level (`NANSCOPE_DEBUG=1`).

    Args:
        notes: list of str. The report's notes.
        part: str. What the body makes, as a noun phrase ("the validation loss").
    """
    try:
        yield
    except Exception as exc:
        log.debug("%s failed", part, exc_info=True)
        notes.append(failure_note(part, exc))


def failure_note(part: str, exc: BaseException) -> str:
    """"<part> failed while the report was finished (<Type>: <message>) and is left out"."""
    what = " ".join(f"{type(exc).__name__}: {exc}".split())[:200]
    bug = "" if isinstance(exc, OSError) else "; please report this as a nanscope bug"
    return f"{part} failed while the report was finished ({what}) and is left out{bug}"
