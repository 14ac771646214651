"""The run as the rules see it: plain numbers that `nanscope report` could rebuild from a trace.

A detector reads `Facts` only: the run description, the first non-finite value, every step's
scalars that the rules judge, the finite steps' scalars, each probed layer's extremes and trend,
and the scale of the training data (`rules.evidence`). No live Keras model, no report object:
`facts_from` takes them apart once, at the edge.
"""

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from nanscope.engine.records import StepRecord
from nanscope.engine.model_view import probed_layers
from nanscope.tf_types import KerasModel
from nanscope.rules.evidence import BatchRows, FeatureScale, RunEvidence, TargetScale
from nanscope.rules.outliers import Glitches
from nanscope.store.history import StepHistory
from nanscope.tf_types import Layer

# The step columns the rules read of every step (SERIES names; see history.series_columns).
STEP_COLUMNS = ("phase", "update_skipped", "loss_scale", "loss_scale_before", "grad_nonfinite")
# Keras activations that grow without bound, as relu does (the bounded-activation rule's case).
RELU_NAMES = {"relu", "leaky_relu", "elu", "relu6"}
# Layers of the relu family, as a model's layer or as another layer's activation.
RELU_LAYERS = ("ReLU", "LeakyReLU", "ELU")


class FirstNonfinite(Protocol):
    """The first non-finite value, as far as the rules read it (report.model.FirstNonfinite, a layer up)."""

    @property
    def step(self) -> int: ...

    @property
    def phase(self) -> str: ...

    @property
    def layer(self) -> str | None: ...

    @property
    def layer_class(self) -> str | None: ...

    @property
    def op(self) -> str | None: ...

    @property
    def source(self) -> str | None: ...

    @property
    def inputs(self) -> dict[str, Any] | None: ...

    @property
    def detail(self) -> list[str]: ...

    @property
    def output(self) -> str | None: ...

    @property
    def loss(self) -> str | None: ...

    @property
    def context(self) -> dict[str, Any]: ...


class Report(Protocol):
    """The report the rules diagnose, as far as `facts_from` and `diagnose` read it (report.model.TraceReport, a
    layer up)."""

    @property
    def run(self) -> dict[str, Any] | None: ...

    @property
    def first_nonfinite(self) -> FirstNonfinite | None: ...

    @property
    def history(self) -> StepHistory | None: ...

    @property
    def records(self) -> list[StepRecord]: ...

    @property
    def layers(self) -> list[tuple[str, str]]: ...

    @property
    def notes(self) -> list[str]: ...


@dataclass
class HealthySteps:
    """The finite steps of a run: their numbers and scalars, one entry per finite step (float64 arrays)."""

    steps: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    update_ratio: np.ndarray
    weight_norm: np.ndarray

    def __len__(self) -> int:
        return len(self.steps)


@dataclass
class LayerFacts:
    """One probed layer over the run.

    Args:
        name, cls: str. The layer's name and class.
        dtype: str. Its compute dtype as the model says ("float32" when the model is not known).
        relu_like: bool. Its activation grows without bound (relu, leaky relu, elu; a ReLU layer).
        called_steps: int. Steps it ran on.
        max_abs: float. Largest |output| over every step; max_abs_healthy over the finite steps (None: none).
        underflow_max: float. Largest fraction of its non-zero outputs below float16's smallest normal.
        trend_steps, trend_values: np.ndarray. Its max |output| over the last healthy steps (history.TREND_WINDOW).
    """

    name: str
    cls: str
    dtype: str = "float32"
    relu_like: bool = False
    called_steps: int = 0
    max_abs: float = 0.0
    max_abs_healthy: float | None = None
    underflow_max: float = 0.0
    trend_steps: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    trend_values: np.ndarray = field(default_factory=lambda: np.empty(0))


@dataclass
class Facts:
    """What the detectors read.

    Args:
        run: dict. The run description (`report.run`: optimizer config, loss scaling, layer dtypes, ...).
        first: report.FirstNonfinite or None. The first non-finite value: step, phase, op, source, the op's
            input statistics (`inputs`) and what the replay found around it (`context`).
        healthy: HealthySteps.
        steps: dict of str -> np.ndarray, or None. Every step's number ("step") and STEP_COLUMNS; None for a
            run with no step.
        kept: list of (step, loss). The kept full rows' steps and losses, in step order.
        layers: list of LayerFacts, in the report's layer order.
        features, targets: list of evidence.FeatureScale / TargetScale, or None when not measured.
        glitches: dict or None. Training rows far outside their column (`outliers.glitches_in`).
        initial_weight_norm: float or None. The trainable weights' norm before the first step, where known.
        batch_rows: callable(step) -> int array, or None. The dataset rows of a step's batch, where the run
            knows its batch order (a trace does not).
    """

    run: dict[str, Any]
    first: FirstNonfinite | None = None
    healthy: HealthySteps = field(default_factory=lambda: _healthy(None))
    steps: dict[str, np.ndarray] | None = None
    kept: list[tuple[int, float]] = field(default_factory=list)
    layers: list[LayerFacts] = field(default_factory=list)
    features: list[FeatureScale] | None = None
    targets: list[TargetScale] | None = None
    glitches: Glitches | None = None
    initial_weight_norm: float | None = None
    batch_rows: BatchRows | None = None

    @property
    def failed(self) -> bool:
        """True when the run went non-finite."""
        return self.first is not None


def facts_from(report: Report, evidence: RunEvidence) -> Facts:
    """The Facts of a TraceReport and its RunEvidence (`rules.evidence`).

    The initial weight norm is measured here; a failure to measure it leaves it None (the
    clip-gradients rule then falls back on the first healthy step's norm).
    """
    history = report.history
    return Facts(
        run=dict(report.run or {}), first=report.first_nonfinite, healthy=_healthy(history),
        steps=_steps(history), kept=[(r.step, r.loss) for r in report.records],
        layers=_layers(report.layers, history, evidence.keras_model), features=evidence.features,
        targets=evidence.targets, glitches=evidence.glitches, initial_weight_norm=_initial(evidence),
        batch_rows=evidence.batch_rows)


def _healthy(history: StepHistory | None) -> HealthySteps:
    if history is None:
        empty = np.empty(0)
        return HealthySteps(np.empty(0, np.int64), empty, empty, empty, empty)
    found = history.healthy()
    return HealthySteps(found.steps, found.loss, found.grad_norm, found.update_ratio, found.weight_norm)


def _steps(history: StepHistory | None) -> dict[str, np.ndarray] | None:
    if history is None or not history.count:
        return None
    return {"step": history.steps(), **{name: history.column(name) for name in STEP_COLUMNS}}


def _layers(names: list[tuple[str, str]], history: StepHistory | None, keras_model: KerasModel) -> list[LayerFacts]:
    by_name = {layer.name: layer for layer in probed_layers(keras_model)}
    found = []
    for index, (name, cls) in enumerate(names):
        layer = by_name.get(name)
        facts = LayerFacts(name, cls, str(getattr(layer, "compute_dtype", "float32")) if layer is not None
                           else "float32", _relu_like(layer))
        if history is not None and index < len(history.layers):
            aggregate = history.layers[index]
            facts.called_steps, facts.max_abs = aggregate.called_steps, aggregate.max_abs
            facts.max_abs_healthy, facts.underflow_max = aggregate.max_abs_healthy, aggregate.underflow_max
            facts.trend_steps, facts.trend_values = history.layer_trend(index)
        found.append(facts)
    return found


def _relu_like(layer: Layer | None) -> bool:
    """An unbounded relu-family output: the layer is a ReLU or LeakyReLU, or its activation is one, by name
    (`activation="relu"`, `keras.activations.elu`) or as a layer object (`activation=keras.layers.LeakyReLU()`)."""
    activation = getattr(layer, "activation", None)
    name = getattr(activation, "__name__", "") if activation is not None else ""
    return name in RELU_NAMES or type(layer).__name__ in RELU_LAYERS or type(activation).__name__ in RELU_LAYERS


def _initial(evidence: RunEvidence) -> float | None:
    measure = evidence.initial_weight_norm
    if measure is None:
        return None
    try:
        return float(measure())
    except Exception:  # a guest's model whose initial weights cannot be read: the rule falls back, as documented
        return None
