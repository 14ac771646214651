"""Verdicts on the first non-finite step: does it reproduce, and did the batch or the model's state cause it?

Megatron-LM's rerun state machine re-runs a failing iteration to tell a deterministic
fault from a transient one; PaLM's ablation ran the spiking batches from an earlier
checkpoint to tell the data from the state. Both, here, on the guest's own compiled
step, from states kept anyway:

- `reproducible`: the step again, from the state before it (the step snapshot), on the same batch.
  True: non-finite again (deterministic). False: finite this time (nondeterminism, a hardware or
  other transient fault). None: not checked.
- `origin`: the same batch from the oldest earlier state in the ring. "batch": non-finite from there
  too, so the data alone causes it. "state": finite there, so the model's state (weights, optimizer
  moments, learning rate) drifted into it. None: not checked (no earlier state).

Each re-run leaves every variable as it found it.
"""

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from nanscope.engine.records import StepRecord
from nanscope.guard.ring import SnapshotRing
from nanscope.guard.state import State
from nanscope.tf_types import Batch

if TYPE_CHECKING:
    from nanscope.report.model import FirstNonfinite


def judge(first: "FirstNonfinite", state: State, rerun: Callable[[Batch], StepRecord], ring: SnapshotRing | None
          ) -> list[str]:
    """Fill `first.reproducible` and `first.origin`; return the detail lines they add.

    Args:
        first: FirstNonfinite of the step the snapshot holds.
        state: GuestState.
        rerun: callable(batch) -> StepRecord. The compiled step on `batch` from the variables as they are.
        ring: SnapshotRing or None.
    """
    held = state.held_step()
    if held != first.step:
        return [f"verdicts: not re-run: the device holds step {held}, not {first.step}"]
    batch = state.batch()
    started = time.perf_counter()
    with state.before_step():
        again = rerun(batch)
    first.reproducible = again.phase is not None
    lines = [_reproducible_line(first, again)]
    entry = ring.before(first.step, newest=False) if ring is not None else None
    if not first.reproducible:
        lines.append("origin: not checked: the step did not reproduce")
    elif entry is None:
        lines.append("origin: not checked: no earlier state kept" + (
            f" yet (one is taken every {ring.every} steps)" if ring is not None else
            " (snapshot_every=N keeps one every N steps)"))
    else:
        with state.before_step(entry.values):
            earlier = rerun(batch)
        first.origin = "batch" if earlier.phase is not None else "state"
        lines.append(_origin_line(first, entry.step, earlier))
    lines[0] += f" (re-runs: {time.perf_counter() - started:.3f} s)"
    return lines


def _reproducible_line(first: "FirstNonfinite", again: StepRecord) -> str:
    if first.reproducible:
        return f"reproducible: re-run from the state before step {first.step} on its batch, it is non-finite again " \
               f"({again.phase} pass): deterministic"
    return (f"reproducible: no: re-run from the state before step {first.step} on its batch, it stays finite "
            "(nondeterminism or a transient fault)")


def _origin_line(first: "FirstNonfinite", step: int, earlier: StepRecord) -> str:
    if first.origin == "batch":
        return f"origin: batch: from the state before step {step} the same batch is non-finite too " \
               f"({earlier.phase} pass)"
    return (f"origin: state: from the state before step {step} the same batch stays finite: the model's state "
            "drifted (learning rate, optimizer moments)")
