"""Where a non-finite step first shows its value: the phase, the output, the layer or variable, the bad rows.

Shared by trace-steps (`nanscope.run.trace`), the repro replay (`nanscope.forensics`) and
the `NanScope` callback: each passes the names its step records refer to, so none
needs the others' engine or session objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nanscope.data import inputs, targets
from nanscope.data.targets import Arrays
from nanscope.engine.records import StepRecord, first_nonfinite_replica, first_nonfinite_worker
from nanscope.report.model import FirstNonfinite

SHOWN = 8


@dataclass
class StepNames:
    """What the columns of a StepRecord refer to.

    Args:
        layers: list of (name, class) pairs, in the order of `record.layers`.
        call_order: list of str. Layer names in the order the forward pass called them.
        variables: list of str. Trainable variable names, in the order of `record.variables`.
        outputs: list of str. Model output names, in the order of `record.outputs`.
    """

    layers: list[tuple[str, str]] = field(default_factory=list)
    call_order: list[str] = field(default_factory=list)
    variables: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)


def attribute_from_record(record: StepRecord, names: StepNames) -> FirstNonfinite:
    """The FirstNonfinite a compiled step's record shows: phase, output, first layer (forward) or variable.

    The data phase's detail (which features and rows) needs the batch: see `describe_bad_batch`.

    Args:
        record: StepRecord. A step whose `phase` is not None.
        names: StepNames. What the record's columns refer to.
    """
    phase = record.phase
    assert phase is not None  # only a non-finite step is attributed
    first = FirstNonfinite(step=record.step, phase=phase, replica=first_nonfinite_replica(record),
                           worker=first_nonfinite_worker(record))
    output = record.nonfinite_output(phase)
    if output is not None and output < len(names.outputs):
        first.output = names.outputs[output]
    if phase == "forward":
        first.layer, first.layer_class = _first_bad_layer(record, names)
    elif phase in ("backward", "update"):
        attribute = "grad_nonfinite" if phase == "backward" else "weight_nonfinite"
        bad = [names.variables[i] for i, v in enumerate(record.variables) if getattr(v, attribute)]
        if bad:
            # Gradients flow from the loss backwards: the last variable is nearest the loss.
            first.variable = bad[-1] if phase == "backward" else bad[0]
            first.layer = first.variable.rsplit("/", 1)[0] if "/" in first.variable else None
            first.detail = [f"{len(bad)} of {len(record.variables)} variables affected"]
        if phase == "backward" and record.update_skipped:
            first.detail.append(
                f"the LossScaleOptimizer skipped this update with its scale at {record.loss_scale_before or 0:g}, as "
                "it skipped most of the updates before it: the gradients are not finite at any scale it tried, and "
                "no weight is changing")
    return first


def _first_bad_layer(record: StepRecord, names: StepNames) -> tuple[str | None, str | None]:
    """(name, class) of the first layer called whose output was non-finite and not expected to be; (None, None)."""
    index_of = {name: i for i, (name, _) in enumerate(names.layers)}
    for name in names.call_order:
        index = index_of.get(name)
        if index is not None and record.layers[index].nonfinite and index not in record.expected_nonfinite:
            return name, names.layers[index][1]
    return None, None


def describe_bad_batch(x: Arrays, y: Arrays, rows: np.ndarray, feature_names: Sequence[str] = (),
                       target_names: Sequence[str] = (), output_names: Sequence[str] = ()) -> list[str]:
    """Which features and which dataset rows of a batch hold non-finite values, one line per input or target.

    Args:
        x: array, or a dict/tuple of arrays for a model with several inputs.
        y: array, or a tuple of arrays (one per output) for a multi-output model.
        rows: numpy int array. The dataset row of each batch row.
        feature_names: list of str. Names of x's columns (one input), when known.
        target_names: list of str. Names of y's columns (one output), when known.
        output_names: list of str. Names of the outputs of a multi-output model.
    """
    arrays: list[tuple[str, Any, list[str]]]
    if targets.is_multi(y):
        arrays = [(name, part, []) for name, part in zip(output_names or [f"y{i}" for i in range(len(y))], y)]
    else:
        arrays = [("y", y, list(target_names))]
    features = [(label, part, list(feature_names) if label == "x" else []) for label, part in inputs.named(x)]
    lines: list[str] = []
    for label, array, names in (*features, *arrays):
        if not np.issubdtype(array.dtype, np.floating):
            continue
        line = bad_values_line(label, array, rows, names, "feature" if label.startswith("x") else "target")
        if line is not None:
            lines.append(line)
    return lines


def bad_values_line(label: str, array: Any, rows: Any, names: Sequence[str] = (), kind: str = "value",
                    rows_are: str = "dataset rows") -> str | None:
    """One line naming the columns and rows of a float array that hold NaN/Inf; None when it holds none.

    Args:
        label: str. How the array is called ("x", "y", "sample_weight", an input's name).
        array: np.ndarray with a leading row axis.
        rows: np.ndarray. What to call each row (dataset rows, or positions in the batch).
        names: list of str. Column names, where known ("x[3]" is used past them).
        kind: str. "feature", "target" or "value", for the message.
        rows_are: str. What `rows` number, for the message.
    """
    if not np.issubdtype(array.dtype, np.floating) or array.ndim == 0:
        return None
    bad = ~np.isfinite(array.reshape(len(array), -1))
    if not bad.any():
        return None
    bad_rows = np.asarray(rows)[bad.any(axis=1)]
    columns = np.flatnonzero(bad.any(axis=0))
    shown = [names[c] if c < len(names) else f"{label}[{c}]" for c in columns[:SHOWN]]
    return (
        f"{label}: {int(bad.sum())} non-finite value(s) in {kind}(s) "
        f"{', '.join(shown)}{' ...' if len(columns) > SHOWN else ''}; {rows_are} "
        f"{', '.join(str(int(r)) for r in bad_rows[:SHOWN])}{' ...' if len(bad_rows) > SHOWN else ''}"
    )
