"""Minimal runs for the boundary tests: a report whose steps hold exactly the values a test sets.

Each test builds the few steps a threshold reads (everything else finite and unremarkable),
hands them to the rules through `diagnose` and the rule ids, and reads back what fired.
A threshold is then checked just below, at and just above its value, written out in the
test (not imported), so a changed constant fails a test too.
"""

import math

import numpy as np

from nanscope.engine.records import LayerStats, StepRecord, VariableStats
from nanscope.store.history import StepHistory
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.rules.diagnose import diagnose
from nanscope.rules.evidence import RunEvidence

LAYERS = [("hidden", "Dense"), ("head", "Dense")]
VARIABLES = ["hidden/kernel"]


def up(value):
    """The next float64 above `value`."""
    return float(np.nextafter(value, math.inf))


def down(value):
    """The next float64 below `value`."""
    return float(np.nextafter(value, -math.inf))


def up32(value):
    """The next float32 above float32(`value`): the step history keeps every step's scalars as float32."""
    return float(np.nextafter(np.float32(value), np.float32(math.inf)))


def step(number, *, loss=1.0, grad=1.0, update_ratio=1e-3, weight_norm=1.0, layer_max=(1.0, 1.0), underflow=0.0,
         loss_scale=None, skipped=False, loss_nonfinite=False, weights_nonfinite=0, grad_nonfinite=0):
    """A StepRecord with one variable, two layers and every other column finite and plain."""
    layers = [LayerStats(peak, peak / 2, 0, 0.0, 0.0, underflow_fraction=underflow) for peak in layer_max]
    variables = [VariableStats(grad, grad_nonfinite, weight_norm, update_ratio, 1 if weights_nonfinite else 0)]
    return StepRecord(step=number, batch_rows=8, loss=loss, data_loss=loss, grad_global_norm=grad,
                      applied_grad_global_norm=grad, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                      loss_nonfinite=loss_nonfinite, grad_nonfinite=grad_nonfinite, weights_nonfinite=weights_nonfinite,
                      layers=layers, variables=variables, loss_scale=loss_scale, update_skipped=skipped,
                      loss_scale_before=2 * loss_scale if loss_scale else None)


def report_of(records, first=None, dtype="float32", lr=0.01, loss_scaling=False):
    """A TraceReport over `records`, with layers of `dtype` and an SGD-like optimizer of learning rate `lr`."""
    run = {"optimizer_config": {"learning_rate": lr, "epsilon": 1e-7}, "loss_scaling": loss_scaling,
           "layer_dtypes": {name: dtype for name, _ in LAYERS}}
    history = StepHistory(len(LAYERS), len(VARIABLES))
    for record in records:
        history.add(record)
    return TraceReport(run=run, layers=list(LAYERS), layer_order=[n for n, _ in LAYERS], variables=list(VARIABLES),
                       history=history, first_nonfinite=first)


def first_at(number, phase="loss", **fields):
    """A FirstNonfinite at step `number`."""
    return FirstNonfinite(step=number, phase=phase, **fields)


def fired(report, evidence=None):
    """{rule id: Recommendation} of what `diagnose` found; a detector that raised fails the test."""
    found = diagnose(report, evidence or RunEvidence())
    assert not any("failed while the report was finished" in note for note in report.notes), report.notes
    return {rec.id: rec for rec in found}


def ranked(report, evidence=None):
    """The rule ids `diagnose` found, in its order."""
    return list(fired(report, evidence))
