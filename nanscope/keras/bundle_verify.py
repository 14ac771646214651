"""`nanscope replay DIR --verify` on a fit bundle: each fix nanscope can apply, tried on the saved step.

Every fix starts from the saved state before the step and runs the model's own
`train_step` once on the saved batch (changed, for a data fix), under the op watch
(`bundle_replay.run_saved_step`). A fix is `helped` when the step's loss, its gradients
and its update stay finite and the loss on the same batch after the update is finite
too; a recommendation is `verified` when one of its fixes helped, `false` when none did.

What one step shows, and what it cannot: it shows whether a fix keeps THIS step
finite. It cannot show that training stays finite afterwards (`trace-steps --verify`
trains whole runs for that). When the weights from before the step already give a
non-finite forward pass or loss, a fix that acts only on the gradients or the update
(learning rate, clipping, epsilon) cannot change this step: it is not tried, and its
`verified` stays null (undecided), never a false "no". Past step 0 those weights are what
the earlier steps made of them, without the fix: a fix of the data or the model that
still fails on this step is undecided too (null), not "no".
"""

from dataclasses import dataclass, field

import numpy as np

from nanscope.internals import flatten_layers
from nanscope.keras.bundle_replay import run_saved_step
from nanscope.runtime import tensorflow
from nanscope.verify import LR_FACTORS, SAFE_EPSILON, _moments, ranked_by_verification

# Phases in which the weights before the step already gave a non-finite value: a fix to the update comes too late.
BEFORE_UPDATE = ("forward", "loss")


@dataclass
class StepFix:
    """One fix applied to the saved step.

    Args:
        name: str. Short label ("lr/10", "drop 2 non-finite rows").
        params: dict. What it sets, for the report.
        acts_on: str. "update" (the optimizer: too late when the forward pass is already non-finite) or "step".
        change: callable(model) -> callable undo, optional. Changes the model or optimizer after the state is put back.
        batch: the batch to run on instead of the saved one, optional.
    """

    name: str
    params: dict = field(default_factory=dict)
    acts_on: str = "update"
    change: object = None
    batch: object = None


def verify_saved_step(bundle, report, unfixed):
    """Try the fixes of `report.recommendations` on the saved step; record `verification` and `verified` on each.

    Args:
        bundle: FitBundle.
        report: TraceReport of the replay.
        unfixed: StepOutcome of the replay without any fix.
    """
    step = int(bundle.document["step"])
    report.notes.append("--verify on a fit bundle tries each fix on the saved step only: it shows whether that one "
                        "step (its loss, gradients, update, and the loss after it) stays finite, not that training "
                        "stays finite afterwards")
    if unfixed.finite:
        report.notes.append(f"--verify: step {step} stayed finite when replayed without a fix, so one step cannot "
                            "tell a fix apart; no fix was tried")
        return report
    too_late = unfixed.event is not None and unfixed.event.phase in BEFORE_UPDATE
    # Past step 0 the weights are what the run's earlier steps made of them: when they already give a non-finite
    # forward pass, a fix that fails on this step may still have prevented it from the start.
    inherited = step > 0 and report.first_nonfinite is not None and report.first_nonfinite.phase in BEFORE_UPDATE
    for rec in report.recommendations:
        fixes = fixes_for(rec, bundle, report)
        skipped = [fix.name for fix in fixes if too_late and fix.acts_on == "update"]
        fixes = [fix for fix in fixes if fix.name not in skipped]
        if skipped:
            report.notes.append(f"--verify: {', '.join(skipped)} ({rec.id}) not tried: the weights before step {step} "
                                f"already give a non-finite {unfixed.event.phase}, which no change to the update can "
                                "undo on this step; whether it prevents the blow-up needs the steps before "
                                "(trace-steps --verify, or a new fit)")
        if not fixes:
            continue
        rec.verification = [_row(fix, _tried(bundle, fix), unfixed, step) for fix in fixes]
        rec.verified = any(row["helped"] for row in rec.verification)
        if not rec.verified and inherited:
            rec.verified = None
            report.notes.append(f"--verify: {rec.id}: step {step} stays non-finite with the fix, but its weights "
                                "come from the earlier steps, which ran without it: undecided")
    bundle.restore()
    report.recommendations = ranked_by_verification(report.recommendations)
    return report


def _tried(bundle, fix):
    return run_saved_step(bundle, fix.batch, fix.change)


def _row(fix, outcome, unfixed, step):
    event = outcome.event
    return {
        "fix": fix.name, "params": fix.params, "finite": outcome.finite,
        "first_nonfinite_step": None if outcome.finite else step, "steps_run": 1,
        "final_loss": outcome.loss_after, "best_loss": None, "val_loss": None,
        "unfixed_finite": unfixed.finite, "unfixed_final_loss": unfixed.loss_after, "unfixed_best_loss": None,
        "helped": outcome.finite, "one_step": True, "loss": outcome.loss, "unfixed_loss": unfixed.loss,
        "nonfinite_phase": event.phase if event is not None else None,
        "nonfinite_op": event.op if event is not None else None,
    }


def fixes_for(rec, bundle, report):
    """The StepFixes that apply `rec` to the saved step; [] when nanscope cannot apply it itself."""
    build = FIXES.get(rec.id)
    return build(rec, bundle, report) if build is not None else []


def _inner(optimizer):
    return getattr(optimizer, "inner_optimizer", optimizer)


def _setting(name, value, also=None):
    """A change that sets optimizer attributes (the inner optimizer under loss scaling) and puts them back after."""
    values = {name: value, **(also or {})}

    def change(model):
        inner = _inner(model.optimizer)
        before = {key: getattr(inner, key) for key in values}
        for key, new in values.items():
            setattr(inner, key, new)
        return lambda: [setattr(inner, key, old) for key, old in before.items()]

    return change


def _schedule(original, scaled):
    """A change that gives the optimizer another schedule (Keras' public setter takes one) and puts the original
    back after."""
    def change(model):
        inner = _inner(model.optimizer)
        inner.learning_rate = scaled

        def undo():
            inner.learning_rate = original

        return undo

    return change


def _lower_learning_rate(rec, bundle, report):
    from nanscope.learning_rate import scaled_schedule, schedule_of

    schedule = schedule_of(bundle.model.optimizer)
    if schedule is not None:  # the same schedule, scaled
        return [StepFix(f"lr/{f}", {"learning_rate": f"{type(schedule).__name__} x 1/{f}"},
                        change=_schedule(schedule, scaled_schedule(schedule, 1 / f))) for f in LR_FACTORS]
    lr = report.run.get("optimizer_config", {}).get("learning_rate")
    if not isinstance(lr, float):
        return []
    return [StepFix(f"lr/{f}", {"learning_rate": lr / f}, change=_setting("learning_rate", lr / f))
            for f in LR_FACTORS]


def _clip_gradients(rec, bundle, report):
    threshold = rec.data.get("threshold") or 1.0
    return [StepFix(f"global_clipnorm={threshold:g}", {"global_clipnorm": threshold},
                    change=_setting("global_clipnorm", threshold, {"clipnorm": None, "clipvalue": None}))]


def _optimizer_epsilon(rec, bundle, report):
    if not hasattr(_inner(bundle.model.optimizer), "epsilon"):
        return []
    return [StepFix(f"epsilon={SAFE_EPSILON:g}", {"epsilon": SAFE_EPSILON}, change=_setting("epsilon", SAFE_EPSILON))]


def _drop_nonfinite_rows(rec, bundle, report):
    tf, _ = tensorflow()
    leaves = [np.asarray(t) for t in tf.nest.flatten(bundle.batch) if t is not None]
    rows = len(leaves[0]) if leaves and leaves[0].ndim else 0
    bad = np.zeros(rows, bool)
    for leaf in leaves:
        if np.issubdtype(leaf.dtype, np.floating) and leaf.ndim and len(leaf) == rows:
            bad |= ~np.isfinite(leaf.reshape(rows, -1)).all(axis=1)
    if not bad.any() or bad.all():
        return []
    keep = np.flatnonzero(~bad)
    batch = tf.nest.map_structure(lambda t: tf.gather(t, keep) if t is not None else None, bundle.batch)
    return [StepFix(f"drop {int(bad.sum())} non-finite rows", {"dropped_rows": np.flatnonzero(bad).tolist()},
                    acts_on="step", batch=batch)]


def _standardised(part):
    shift, scale = _moments(np.asarray(part))
    return ((np.asarray(part) - shift) / scale).astype(np.asarray(part).dtype)


def _normalize(which):
    def build(rec, bundle, report):
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

    return build


def _bounded_activation(rec, bundle, report):
    _, keras = tensorflow()
    relu = keras.activations.relu
    layers = [layer for layer in flatten_layers(bundle.model) if getattr(layer, "activation", None) is relu
              or (type(layer).__name__ == "ReLU" and getattr(layer, "max_value", 0) is None)]
    if not layers:
        return []

    def change(model):
        saved = [(layer, "activation", layer.activation) if hasattr(layer, "activation") and
                 layer.activation is relu else (layer, "max_value", layer.max_value) for layer in layers]
        for layer, name, _ in saved:
            setattr(layer, name, keras.activations.relu6 if name == "activation" else 6.0)
        return lambda: [setattr(layer, name, old) for layer, name, old in saved]

    return [StepFix("relu->relu6", {"activation": "relu6"}, acts_on="step", change=change)]


# The rules whose fix nanscope can apply to a saved fit step, by rule id (a rule not named here stays unverified).
FIXES = {
    "lower-learning-rate": _lower_learning_rate,
    "clip-gradients": _clip_gradients,
    "optimizer-epsilon": _optimizer_epsilon,
    "clean-input-data": _drop_nonfinite_rows,
    "normalize-inputs": _normalize("x"),
    "normalize-targets": _normalize("y"),
    "bounded-activation": _bounded_activation,
}
