"""The user's step run inside nanscope's hooks, as a guest: a failure of nanscope's own code never stops the step.

Every instrumented step nanscope traces (the fit probe's full and light steps, `instrument`'s full and light
steps) has the same three parts: attach the hooks (and take the snapshot), run the user's step, write the row.
If attaching fails, the hooks attached so far come off and the user's step runs alone, as it would without
nanscope; if writing fails, the step's result is still returned. Either failure goes to `failed`, the owner's
record of its first failure (one warning line and a report note, later).

Example:
    def attach(hooks):
        capture = StepCapture(model, optimizers, trainable)
        hooks.enter_context(capture.attached())
        return capture

    logs = as_guest(attach, lambda: train_step(data), lambda capture, logs: write(capture, logs), keep_first_failure)
"""

import contextlib
from collections.abc import Callable
from typing import TypeVar

Hooks = TypeVar("Hooks")
Result = TypeVar("Result")


def as_guest(attach: Callable[[contextlib.ExitStack], Hooks], step: Callable[[], Result],
             write: Callable[[Hooks, Result], object], failed: Callable[[Exception], None]) -> Result:
    """`step()` with the hooks `attach` enters on the stack it is given, then `write(hooks, result)`; the result.

    Args:
        attach: callable(ExitStack) -> hooks. Makes nanscope's hooks (a capture), enters them on the stack (and
            takes the snapshot), and returns what `write` reads. If it raises, what it entered is exited and
            `step` runs alone.
        step: callable() -> result. The user's step.
        write: callable(hooks, result). nanscope's row of the step; if it raises, the result is still returned.
        failed: callable(Exception). Told of either failure.
    """
    hooks = contextlib.ExitStack()
    try:
        made = attach(hooks)
    except Exception as exc:  # nanscope's own failure: the user's step runs as it would without it
        hooks.close()
        failed(exc)
        return step()
    with hooks:
        result = step()
    try:
        write(made, result)
    except Exception as exc:
        failed(exc)
    return result
