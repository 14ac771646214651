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

Under tf.distribute (trace-steps' `DistributedStep`) each re-run splits the batch over the replicas as the step
did, so each replica gets its own rows again, and its record counts each replica's non-finite values:
`reproducible_replicas` and `origin_replicas` list the replicas non-finite in each re-run, and the lines name
them (and their workers under MultiWorkerMirroredStrategy) beside the replica the step was seen on.

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
    first.reproducible_replicas = nonfinite_replicas(again)
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
        first.origin_replicas = nonfinite_replicas(earlier)
        lines.append(_origin_line(first, entry.step, earlier))
    lines[0] += f" (re-runs: {time.perf_counter() - started:.3f} s)"
    return lines


def nonfinite_replicas(record: StepRecord) -> list[int] | None:
    """The replica ids with a non-finite count in `record` (tf.distribute); None on one device."""
    if not record.replica_nonfinite:
        return None
    return [replica for replica, count in enumerate(record.replica_nonfinite) if count]


def _where(record: StepRecord, replicas: list[int] | None) -> str:
    """" on replica 1", " on replicas 0, 3 (workers 0, 1)"; "" on one device or where no replica's own count shows it
    (a non-finite update of the shared weights)."""
    if not replicas:
        return ""
    text = f" on replica{'s' if len(replicas) > 1 else ''} {', '.join(map(str, replicas))}"
    if record.worker_nonfinite:
        per_worker = len(record.replica_nonfinite) // len(record.worker_nonfinite)
        workers = sorted({replica // per_worker for replica in replicas})
        text += f" (worker{'s' if len(workers) > 1 else ''} {', '.join(map(str, workers))})"
    return text


def _seen(first: "FirstNonfinite") -> str:
    """", seen on replica 1" (and its worker) under tf.distribute; "" on one device."""
    if first.replica is None:
        return ""
    return f", seen on replica {first.replica}" + (f" (worker {first.worker})" if first.worker is not None else "")


def _reproducible_line(first: "FirstNonfinite", again: StepRecord) -> str:
    if first.reproducible:
        return f"reproducible: re-run from the state before step {first.step} on its batch, it is non-finite again " \
               f"({again.phase} pass){_where(again, first.reproducible_replicas)}: deterministic"
    everywhere = " on every replica" if first.reproducible_replicas is not None else ""
    return (f"reproducible: no: re-run from the state before step {first.step} on its batch, it stays finite"
            f"{everywhere} (nondeterminism or a transient fault{_seen(first)})")


def _origin_line(first: "FirstNonfinite", step: int, earlier: StepRecord) -> str:
    if first.origin == "batch":
        return f"origin: batch: from the state before step {step} the same batch is non-finite too " \
               f"({earlier.phase} pass){_where(earlier, first.origin_replicas)}"
    everywhere = " on every replica" if first.origin_replicas is not None else ""
    return (f"origin: state: from the state before step {step} the same batch stays finite{everywhere}: the "
            "model's state drifted (learning rate, optimizer moments)")
