"""`normalize-inputs` and `normalize-targets`: input features or regression targets far from unit scale."""

import math
from dataclasses import replace
from typing import Any

import numpy as np

from nanscope.data import inputs
from nanscope.rules import producer
from nanscope.rules.facts import Facts
from nanscope.rules.fixes import Bundle, Change, LoadedData, Session, StepFix, moments
from nanscope.rules.rule import Finding, Fixtures, Recommendation, Rule
from nanscope.runtime import tensorflow
from nanscope.tf_types import Tensor

NORMALIZE_INPUTS = Rule(
    "normalize-inputs",
    "Normalize the input features",
    "Input features far from unit scale.",
    "norm = keras.layers.Normalization(); norm.adapt(x)  # first layer of the model",
)
NORMALIZE_TARGETS = Rule(
    "normalize-targets",
    "Scale the regression targets",
    "Regression targets with a large scale under an MSE-like loss.",
    "y_mean, y_std = y.mean(0), y.std(0); y = (y - y_mean) / y_std  # invert on predictions",
)
RULES = (NORMALIZE_INPUTS, NORMALIZE_TARGETS)
FIXTURES = {
    "normalize-inputs": Fixtures(fires=("unscaled-inputs",), quiet=("tabular-regression-adam",)),
    "normalize-targets": Fixtures(fires=("unscaled-targets",), quiet=("tabular-regression-adam",)),
}

# Inputs or regression targets whose standard deviation or mean magnitude exceeds
# this are far from unit scale (standardised data has std 1, mean 0).
SCALE_LIMIT = 10.0
# A scale a hundred times past the limit dwarfs any learning-rate effect: no rate that suits the
# other weights absorbs gradients scaled by it. Only a spread (std) this large, in a run that went
# non-finite outside the data phase, makes a scale rule an error on its own evidence; an offset
# (a large mean with a small std) is absorbed by a bias and is at most a warning.
EXTREME_SCALE = 100 * SCALE_LIMIT
# A run that goes non-finite within its first ROOT_CAUSE_STEPS steps does so near its initial weights (an
# optimizer moves each by about its learning rate a step): a value that overflowed or underflowed then took its
# magnitude from the data. Unscaled inputs or targets are the cause and the op's guard treats the symptom, so the
# scale rule ranks first (ROOT_CAUSE_SCORE, above the op rules' 1.0) and is an error.
ROOT_CAUSE_STEPS = 5
ROOT_CAUSE_SCORE = 1.05
# The op rules whose producer overflowed or underflowed (a magnitude the data sets); the others name a value at a
# domain edge (an exact zero, a fully masked row, an inf fill) that no scaling moves.
MAGNITUDE_RULES = {"stable-exp", "stable-log", "loss-scaling", "float32-layer"}
MSE_LIKE_LOSSES = {"mean_squared_error", "mse", "mean_absolute_error", "mae", "huber", "huber_loss", "log_cosh"}


def detect_targets(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for regression targets far from unit scale under an MSE-like loss."""
    if facts.targets is None:  # a run whose targets were not measured
        return []
    found = []
    for target in facts.targets:
        if target.loss.lower() not in MSE_LIKE_LOSSES or not _far(target.std, target.mean_abs):
            continue  # unit scale, or no finite target to measure (clean-input-data's case)
        name, std, mean = target.output, target.std, target.mean_abs
        whose = f"regression targets of output {name!r}" if name else "regression targets"
        lines = [f"{whose} have std {std:.3g} and mean |y| {mean:.3g} under {target.loss} "
                 f"(unit scale: ~1; limit {SCALE_LIMIT:g}); the loss and its gradients scale with y squared"]
        data = {"y_std": std, "y_mean_abs": mean, **({"output": name} if name else {})}
        score = 0.8 if max(std, mean) > EXTREME_SCALE else 0.7
        found.append(_ranked(facts, NORMALIZE_TARGETS, score, std, lines, data))
    return found


def detect_inputs(facts: Facts) -> list[Finding]:
    """(score, Recommendation) pairs for input features far from unit scale."""
    if facts.features is None:
        return []
    far = [f for f in facts.features if _far(f.std, f.mean_abs)]
    if not far:
        return []
    largest = sorted(far, key=lambda f: -max(f.std, f.mean_abs))  # the farthest first: those are named
    shown = ", ".join(f"{f.name} (std {f.std:.3g})" for f in largest[:5])
    more = f", and {len(far) - 5} more" if len(far) > 5 else ""
    lines = [f"{len(far)} input feature(s) far from unit scale: {shown}{more}"]
    spread = max(f.std for f in far)
    return [_ranked(facts, NORMALIZE_INPUTS, 0.6, spread, lines, {"features": [f.key for f in far
                                                                             if f in largest[:20]]})]


def _ranked(facts: Facts, rule: Rule, score: float, spread: float, lines: list[str],
            data: dict[str, Any]) -> Finding:
    """(score, Recommendation) of a scale rule: first, at error level, where the scale is the failure's root cause.
    A spread (std) past SCALE_LIMIT is needed for that: an offset alone is absorbed by a bias."""
    first = facts.first
    if not (spread > SCALE_LIMIT and first is not None and root_cause(facts)):
        return score, rule.recommend(scale_severity(facts, spread), lines, data=data)
    lines = [*lines, f"the run went non-finite at step {first.step}, before training moved the weights far from "
                     f"their initial values: the {first.op or 'non-finite'} value took its magnitude from the data; "
                     "scale the data before guarding the op"]
    return ROOT_CAUSE_SCORE, rule.recommend("error", lines, data={**data, "root_cause": True})


def root_cause(facts: Facts) -> bool:
    """True when data far from unit scale explains the run's failure: it went non-finite outside the data phase
    within ROOT_CAUSE_STEPS steps, and its producer overflowed or underflowed (MAGNITUDE_RULES, or an op no rule
    knows, such as a MatMul that overflowed) rather than hit a domain edge that scaling does not move."""
    first = facts.first
    if first is None or first.phase == "data" or first.step >= ROOT_CAUSE_STEPS:
        return False
    return all(rule.id in MAGNITUDE_RULES for unit in producer.explaining(facts) for rule in unit.RULES)


def _far(std: float, mean_abs: float) -> bool:
    """A finite spread or mean magnitude past SCALE_LIMIT; NaN (nothing finite was measured) is not."""
    return math.isfinite(std) and math.isfinite(mean_abs) and max(std, mean_abs) > SCALE_LIMIT


def scale_severity(facts: Facts, spread: float) -> str:
    """The severity of a scale rule (normalize-inputs, normalize-targets) whose data has std `spread`.

    info in a run that stayed finite; at most a warning when the run went non-finite, since a
    scale explains a divergence only through the gradients it makes; an error only when the run
    went non-finite outside the data phase (a NaN row explains a `data`-phase one) and the spread
    alone is extreme.
    """
    first = facts.first
    if first is None:
        return "info"
    return "error" if first.phase != "data" and spread > EXTREME_SCALE else "warning"


def verify_fixes(rec: Recommendation, session: Session, run: dict[str, Any]) -> list[Change]:
    """Training on standardised inputs (normalize-inputs) or targets (normalize-targets)."""
    del run  # Unused
    if rec.id == "normalize-inputs":
        return [standardized_inputs(session)]
    return [standardized_targets(session, rec.data.get("output"))]


def standardized_targets(session: Session, output: str | None = None) -> Change:
    """A Change that trains on standardised regression targets: of `output`, or of the only output.

    Mean and standard deviation come from the training rows and are applied to the
    validation rows too, as a user would do. The loss is then in standardised units.
    """
    index = next((i for i, o in enumerate(session.loss.outputs) if o.name == output), None)
    y = session.train.y if index is None else session.train.y[index]
    shift, scale = moments(y)

    def change(data: LoadedData) -> LoadedData:
        if index is None:
            return replace(data, y=((data.y - shift) / scale).astype(data.y.dtype))
        parts = list(data.y)
        parts[index] = ((parts[index] - shift) / scale).astype(parts[index].dtype)
        return replace(data, y=tuple(parts))

    target = f"y[{output}]" if index is not None else "y"
    return Change(f"standardise {target}", {"standardize": target}, data=change, rescales_loss=True)


def standardized_inputs(session: Session) -> Change:
    """A Change that trains on standardised input features (per feature, as `keras.layers.Normalization`);
    each input of a model with several is standardised on its own features. Inputs that hold ids (integer
    inputs, inputs that feed an `Embedding`: `inputs.id_inputs`) are left as they are."""
    ids = inputs.ids_of(session.train, session.model.keras_model)
    found = {label: moments(part) for label, part in inputs.named(session.train.x)
             if np.issubdtype(part.dtype, np.floating) and label not in ids}

    def standardized(label: str, part: np.ndarray) -> np.ndarray:
        moment = found.get(label)
        return part if moment is None else ((part - moment[0]) / moment[1]).astype(part.dtype)

    def change(data: LoadedData) -> LoadedData:
        if not inputs.is_multi(data.x):
            return replace(data, x=standardized("x", data.x))
        keys = list(data.x) if isinstance(data.x, dict) else range(len(data.x))
        x = {k: standardized(label, part) for k, (label, part) in zip(keys, inputs.named(data.x))}
        return replace(data, x=x if isinstance(data.x, dict) else tuple(x.values()))

    return Change("standardise x", {"standardize": "x"}, data=change)


def bundle_fixes(rec: Recommendation, bundle: Bundle, run: dict[str, Any]) -> list[StepFix]:
    """The saved batch with its inputs (normalize-inputs) or targets standardised by the batch's own moments."""
    del run  # Unused
    which = "x" if rec.id == "normalize-inputs" else "y"
    tf, keras = tensorflow()
    x, y, weights = keras.utils.unpack_x_y_sample_weight(bundle.batch)
    part = x if which == "x" else y
    if part is None or not all(tf.is_tensor(t) and t.dtype.is_floating for t in tf.nest.flatten(part)):
        return []
    part = tf.nest.map_structure(lambda t: tf.constant(_standardised(t)), part)
    x, y = (part, y) if which == "x" else (x, part)
    batch = (x, y) if weights is None else (x, y, weights)
    return [StepFix(f"standardise {which} (this batch's mean and std)", {"standardize": which}, acts_on="step",
                    batch=batch)]


def _standardised(part: Tensor) -> np.ndarray:
    shift, scale = moments(np.asarray(part))
    return ((np.asarray(part) - shift) / scale).astype(np.asarray(part).dtype)
