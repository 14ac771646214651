"""Per-step records: plain numbers keyed by step, layer and variable.

A `StepRecord` is what one instrumented step measured. It serialises to one
JSON line of the trace file, and a report can be redrawn from those lines without
rerunning training.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


from nanscope.engine.schema import LAYER, OUTPUT, SCALARS, VARIABLE
from nanscope.jsonio import decode_float

# The step function's output arrays, or empty lists for the parts a sentinel step does not measure.
Rows = np.ndarray | list[Any]


@dataclass
class LayerStats:
    """One layer's output on one step: max |x|, mean |x|, non-finite count, fraction of exact zeros, loss terms.

    `underflow_fraction` is the fraction of non-zero float16 outputs below float16's smallest normal (0 for
    other dtypes). `zero_fraction` is None on a step that did not count zeros (`engine.probes.ZEROS_EVERY`).
    """

    max_abs: float
    mean_abs: float
    nonfinite: int
    zero_fraction: float | None
    loss_term: float
    called: bool = True
    underflow_fraction: float = 0.0


@dataclass
class VariableStats:
    """One variable on one step: gradient norm, non-finite gradient entries, weight norm, update ratio |dw|/|w|."""

    grad_norm: float
    grad_nonfinite: int
    weight_norm: float
    update_ratio: float
    weight_nonfinite: int


@dataclass
class OutputStats:
    """One output of a multi-output model on one step: its own (unweighted) mean loss and non-finite counts."""

    loss: float
    target_nonfinite: int
    prediction_nonfinite: int


@dataclass
class StepRecord:
    """What one instrumented train step measured.

    Args:
        step: int. Step number, from 0, in the order batches are drawn.
        batch_rows: int. Rows in the batch.
        loss: float. Total loss (data loss plus layer loss terms).
        data_loss: float. The loss function's value alone.
        grad_global_norm: float. Global norm of the raw gradients.
        applied_grad_global_norm: float. Global norm of the gradients handed to the optimizer.
        x_nonfinite, y_nonfinite: int. Non-finite entries in the batch.
        output_nonfinite: int. Non-finite entries in the model output.
        loss_nonfinite: bool. The total loss is not finite.
        grad_nonfinite: int. Non-finite gradient entries.
        weights_nonfinite: int. Non-finite weight entries after the update.
        layers: list of LayerStats, in the order of the probed layers.
        variables: list of VariableStats, in the order of the trainable variables.
        loss_scale: float or None. The LossScaleOptimizer's scale after the step (mixed precision).
        loss_scale_before: float or None. Its scale before the step, the one this step's loss was scaled by.
        update_skipped: bool. The LossScaleOptimizer skipped this update: its scaled gradients
            overflowed, which is how dynamic loss scaling works, not a failure of the run.
        loss_missing: bool. The step gave no loss to record (a custom step under `instrument` that
            returns none): `loss` and `data_loss` are NaN for "unknown", and do not make the step
            non-finite; the batch, layers, gradients and weights still do.
        scale_collapsed: bool. This skipped update is one of so many that the loss scale has collapsed
            (`engine.loss_scale.LossScaleWatch`): loss scaling no longer absorbs it, and the step is non-finite.
        expected_nonfinite: list of int. Indices of layers whose non-finite outputs are
            intended (an attention mask's -inf): reported, but they do not make a step non-finite.
        replica_nonfinite: list of int. Under tf.distribute, per replica: non-finite entries in
            its share of the batch, its model outputs and its own gradients. Empty on one device.
            Replica ids are global: worker w's replicas follow worker w-1's.
        worker_nonfinite: list of int. Under MultiWorkerMirroredStrategy, per worker: the sum of
            its replicas' `replica_nonfinite`. Empty otherwise.
        outputs: list of OutputStats. Per output of a multi-output model, in output order; empty
            for a single-output model, whose `data_loss` is its output's loss.
        overall_norms: (float, float) or None. The norm of all trainable weights after the update and of
            the update, as a sentinel step measures them without per-variable rows; None: from `variables`.
    """

    step: int
    batch_rows: int
    loss: float
    data_loss: float
    grad_global_norm: float
    applied_grad_global_norm: float
    x_nonfinite: int
    y_nonfinite: int
    output_nonfinite: int
    loss_nonfinite: bool
    grad_nonfinite: int
    weights_nonfinite: int
    layers: list = field(default_factory=list)
    variables: list = field(default_factory=list)
    model_loss_term: float = 0.0
    expected_nonfinite: list = field(default_factory=list)
    loss_scale: float | None = None
    update_skipped: bool = False
    loss_scale_before: float | None = None
    loss_missing: bool = False
    scale_collapsed: bool = False
    replica_nonfinite: list = field(default_factory=list)
    worker_nonfinite: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    overall_norms: tuple | None = None

    @classmethod
    def from_arrays(cls, step: int, batch_rows: int, scalars: Rows, layer_stats: Rows, layer_terms: Rows,
                    var_stats: Rows) -> StepRecord:
        """Build a record from the step function's four output arrays (laid out by engine/schema.py)."""
        # Python floats first: indexing numpy rows entry by entry costs several times more.
        scalars, layer_stats, layer_terms, var_stats = (
            np.asarray(a, np.float64).tolist() for a in (scalars, layer_stats, layer_terms, var_stats))
        s = SCALARS.named(scalars)
        layers = [layer_stats_of(LAYER.named(row), term) for row, term in zip(layer_stats, layer_terms)]
        variables = [variable_stats_of(VARIABLE.named(row)) for row in var_stats]
        outputs = [output_stats_of(OUTPUT.named(scalars[start:start + len(OUTPUT)]))
                   for start in range(len(SCALARS), len(scalars) - len(OUTPUT) + 1, len(OUTPUT))]
        return cls(
            step=step, batch_rows=int(batch_rows), loss=s["loss"], data_loss=s["data_loss"],
            grad_global_norm=s["grad_global_norm"], applied_grad_global_norm=s["applied_grad_global_norm"],
            x_nonfinite=int(s["x_nonfinite"]), y_nonfinite=int(s["y_nonfinite"]),
            output_nonfinite=int(s["output_nonfinite"]), loss_nonfinite=bool(s["loss_nonfinite"]),
            grad_nonfinite=int(s["grad_nonfinite"]), weights_nonfinite=int(s["weights_nonfinite"]),
            layers=layers, variables=variables,
            model_loss_term=float(layer_terms[-1]) if len(layer_terms) > len(layers) else 0.0,
            # 0 is what a producer that does not scale the loss writes: no scale.
            loss_scale=s["loss_scale"] or None,
            update_skipped=bool(s["update_skipped"]),
            loss_scale_before=s["loss_scale_before"] or None,
            loss_missing=bool(s["loss_missing"]),
            outputs=outputs,
        )

    @property
    def finite(self) -> bool:
        """True when nothing in this step was non-finite."""
        return self.phase is None

    @property
    def phase(self) -> str | None:
        """The earliest phase of this step that saw a non-finite value, or None."""
        if self.x_nonfinite or self.y_nonfinite:
            return "data"
        if self.unexpected_nonfinite_layers() or (self.output_nonfinite and not self._expected_layers_nonfinite()):
            return "forward"
        if self.loss_nonfinite or not (self.loss_missing or math.isfinite(self.loss)):
            return "loss"
        if (self.grad_nonfinite or not math.isfinite(self.grad_global_norm)) and not self.absorbed:
            return "backward"
        if self.weights_nonfinite:
            return "update"
        return None

    @property
    def absorbed(self) -> bool:
        """True when loss scaling absorbed this step's non-finite gradients: the update was skipped, and the scale
        has not collapsed (Keras 3's scale has no floor: a skip at a scale below 1 is still loss scaling at work)."""
        return bool(self.update_skipped) and not self.scale_collapsed

    def nonfinite_output(self, phase: str | None) -> int | None:
        """Index of the first output of a multi-output model that shows `phase`'s non-finite value, or None.

        data: its targets; forward: its prediction; loss: its own loss.
        """
        for index, output in enumerate(self.outputs):
            if ((phase == "data" and output.target_nonfinite) or (phase == "forward" and output.prediction_nonfinite)
                    or (phase == "loss" and not math.isfinite(output.loss))):
                return index
        return None

    def unexpected_nonfinite_layers(self) -> list[int]:
        """Indices of layers with non-finite outputs that are not listed as expected."""
        expected = set(self.expected_nonfinite)
        return [i for i, layer in enumerate(self.layers) if layer.nonfinite and i not in expected]

    def _expected_layers_nonfinite(self) -> bool:
        # A model output that is non-finite only because an expected layer's output is
        # (the model ends in the masking layer) is expected too.
        return any(self.layers[i].nonfinite for i in self.expected_nonfinite if i < len(self.layers))


def layer_stats_of(row: Mapping[str, float], term: float) -> LayerStats:
    """LayerStats from a LAYER row (a mapping name -> value) and the layer's loss term."""
    size = row["size"]
    return LayerStats(
        max_abs=float(row["max_abs"]),
        mean_abs=float(row["sum_abs"] / size) if size else 0.0,
        nonfinite=int(row["nonfinite"]),
        zero_fraction=None if row["zeros"] < 0 else float(row["zeros"] / size) if size else 0.0,
        loss_term=float(term),
        called=bool(size > 0),
        underflow_fraction=float(row["tiny"] / size) if size else 0.0,
    )


def output_stats_of(row: Mapping[str, float]) -> OutputStats:
    """OutputStats from an OUTPUT row (a mapping name -> value)."""
    return OutputStats(row["loss"], int(row["target_nonfinite"]), int(row["prediction_nonfinite"]))


def variable_stats_of(row: Mapping[str, float]) -> VariableStats:
    """VariableStats from a VARIABLE row (a mapping name -> value)."""
    return VariableStats(
        grad_norm=float(row["grad_norm"]),
        grad_nonfinite=int(row["grad_nonfinite"]),
        weight_norm=float(row["weight_norm"]),
        update_ratio=_ratio(row["update_norm"], row["weight_norm"]),
        weight_nonfinite=int(row["weight_nonfinite"]),
    )


def _ratio(numerator: float, denominator: float) -> float:
    numerator, denominator = float(numerator), float(denominator)
    if denominator == 0.0:
        return 0.0 if numerator == 0.0 else math.inf
    return numerator / denominator


def expected_layer_indices(patterns: Iterable[str] | None, layer_names: Sequence[str]) -> list[int]:
    """Indices of the layers whose name matches one of the fnmatch-style `patterns` ("attn*/mask")."""
    return [i for i, name in enumerate(layer_names) if any(fnmatch.fnmatchcase(name, p) for p in patterns or ())]


def first_nonfinite_replica(record: StepRecord) -> int | None:
    """The lowest replica id whose batch, outputs or gradients held a non-finite value; None on one device."""
    return next((replica for replica, count in enumerate(record.replica_nonfinite) if count), None)


def first_nonfinite_worker(record: StepRecord) -> int | None:
    """The lowest worker id whose replicas saw a non-finite value; None unless several workers trained."""
    return next((worker for worker, count in enumerate(record.worker_nonfinite) if count), None)


def record_from_dict(line: Mapping[str, Any]) -> StepRecord:
    """A StepRecord from its JSON form (a trace line); "nan"/"inf" strings become floats again."""
    values = {k: decode_float(v) for k, v in line.items()
              if k not in ("kind", "kept", "layers", "variables", "phase", "outputs")}
    rows: dict[str, Any] = {name: [cls(**{k: decode_float(v) for k, v in row.items()}) for row in line.get(name, [])]
            for name, cls in (("layers", LayerStats), ("variables", VariableStats), ("outputs", OutputStats))}
    return StepRecord(**rows, **values)

