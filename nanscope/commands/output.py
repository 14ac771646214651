"""The tail every command ends with: render the report, write its JSON, return the exit code."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from nanscope import interrupt
from nanscope.finishing import optional_part

if TYPE_CHECKING:
    from rich.console import Console

Report = TypeVar("Report")


def outcome(check: Callable[[], object], work: Callable[[], Report], fallback: Callable[[], Report]) -> Report:
    """What `work()` returns, or `fallback()` when a signal stops it first; no later signal interrupts the command.

    The library turns a signal during training into a report of the steps done; a signal
    during start-up (loading the spec, the data, the model) stops `work` before it has a
    report, and `fallback` makes the empty one, so the JSON is written either way. The
    first signal is the only one that raises (`nanscope.interrupt`), so once it is caught
    here nothing can cut the report short.

    A signal before `check` has passed stops the command without a report (exit 130):
    there is no checked place to write it to yet.

    Args:
        check: callable(). Checks the output paths (raises NanscopeError for one that cannot be written).
        work: callable() -> report. The command's library call.
        fallback: callable() -> report. The report of a run stopped before it began.
    """
    result, checked = None, False
    try:
        check()
        checked = True
        result = work()
        interrupt.defer_from_now()
    except KeyboardInterrupt:
        interrupt.defer_from_now()
        if not checked:
            raise
        if result is None:
            result = fallback()
    return result


def console_for(json_out: str | None) -> Console:
    """The console for the human report: stderr when the JSON goes to stdout."""
    from rich.console import Console

    return Console(stderr=json_out == "-", soft_wrap=False)


def deliver(render: Callable[[Console], object], document: Callable[[], Any], json_out: str | None, exit_code: int,
            writes: Iterable[tuple[str, Callable[[], object]]] = ()) -> int:
    """Print the human report, write the other outputs and the JSON, and return the exit code.

    A signal that arrives meanwhile is remembered but does not cut the report short.
    Printing the report or writing a further output that raises (a nanscope bug) does
    not lose the run: the JSON is still written, the exit code stands, and one line
    on stderr says which part is missing.

    Args:
        render: callable(Console). Prints the human report.
        document: callable() -> dict. The JSON document, built only when `json_out` is set.
        json_out: str or None. The `--json` target ("-" for stdout).
        exit_code: int. Returned unchanged.
        writes: iterable of (str, callable()). Further outputs, each named ("the plot out.png"), written after
            the report.
    """
    missing: list[str] = []
    with interrupt.deferred():
        with optional_part(missing, "the printed report"):
            render(console_for(json_out))
        for part, write in writes:
            with optional_part(missing, part):
                write()
        if json_out:
            from nanscope.jsonio import write_json

            write_json(json_out, document())
    for note in missing:
        print(f"nanscope: {note}", file=sys.stderr)
    return exit_code
