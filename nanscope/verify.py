"""Verify recommendations by applying them: `trace-steps --verify`.

For each recommendation nanscope can apply itself (a lower learning rate, gradient
clipping at the computed threshold, relu -> relu6, a larger optimizer epsilon, loss
scaling, standardised inputs or regression targets) it
re-runs the same number of steps from the same initial weights and batch order
with the fix applied, through `nanscope.experiment.run_experiment`, and compares
with the unfixed run. A recommendation is `verified: true` when at least one of
its fixes stays finite and ends below the unfixed run's final loss (or, when the
unfixed run went non-finite, below the loss it started from), `false` when none does, and stays `null` when
nanscope cannot apply it (a Log in the user's own loss: the evidence then names the line to change).
"""

import math
import warnings
from dataclasses import replace

import numpy as np

from nanscope.data import inputs
from nanscope.experiment import Change, run_experiment
from nanscope.internals import flatten_layers
from nanscope.runtime import tensorflow

# Lower the learning rate by these factors (one experiment each).
LR_FACTORS = (10, 100)
# Adam's default epsilon is 1e-7, which is 0 in float16; 1e-4 is representable and still small.
SAFE_EPSILON = 1e-4


def verify_recommendations(session, report):
    """Run the fix experiments for `report.recommendations`, record the results on each, rank by them.

    When every fix that was tried failed on its own, natural combinations of them are tried
    (`COMBINATIONS`: standardised inputs and targets together, a data fix with a lower
    learning rate, clipping with a lower learning rate). Afterwards verified fixes rank
    first, untried ones keep their place below them, and fixes that were tried and failed
    rank last; within each group the order of the diagnosis stays.
    """
    baseline = _baseline(report)
    tried = {}
    for rec in report.recommendations:
        changes = changes_for(rec, session, report)
        if not changes:
            continue
        rec.verification = [_row(run_experiment(session, change, steps=session.spec.train.steps), baseline,
                                 change.rescales_loss) for change in changes]
        rec.verified = any(row["helped"] for row in rec.verification)
        tried[rec.id] = (rec, changes)
    if tried and not any(rec.verified for rec, _ in tried.values()):
        _verify_combinations(session, tried, baseline)
    session.reset_weights()
    report.recommendations = ranked_by_verification(report.recommendations)
    return report


# Fixes that address different causes and are applied together when each fails alone, as a
# user would: scale both ends of a regression, or scale the data and slow the steps. At most
# MAX_COMBINATIONS are run (each is one more training run).
COMBINATIONS = (
    ("normalize-inputs", "normalize-targets"),
    ("normalize-targets", "lower-learning-rate"),
    ("normalize-inputs", "lower-learning-rate"),
    ("clip-gradients", "lower-learning-rate"),
    ("normalize-inputs", "normalize-targets", "lower-learning-rate"),
)
MAX_COMBINATIONS = 3


def _verify_combinations(session, tried, baseline):
    runs = 0
    for ids in COMBINATIONS:
        if runs == MAX_COMBINATIONS:
            return
        if not all(rule_id in tried for rule_id in ids):
            continue
        members = [tried[rule_id] for rule_id in ids]
        change = combined([changes[0] for _, changes in members])
        runs += 1
        row = _row(run_experiment(session, change, steps=session.spec.train.steps), baseline, change.rescales_loss)
        for rec, _ in members:
            rec.verification.append({**row, "together_with": [other for other in ids if other != rec.id]})
            if row["helped"]:
                rec.verified = True
                rec.data["verified_with"] = [other for other in ids if other != rec.id]
        if row["helped"]:
            return


def combined(changes):
    """One Change that applies every change in `changes`: their data changes in turn, their optimizer
    overrides merged, the first changed model; its loss is rescaled when any member's is."""
    def data(loaded):
        for change in changes:
            if change.data is not None:
                loaded = change.data(loaded)
        return loaded

    overrides, params = {}, {}
    for change in changes:
        overrides.update(change.optimizer_overrides)
        params.update(change.params)
    return Change(
        " + ".join(change.name for change in changes), params, overrides,
        grad_transform=next((c.grad_transform for c in changes if c.grad_transform is not None), None),
        model=next((c.model for c in changes if c.model is not None), None),
        loss_scaling=next((c.loss_scaling for c in changes if c.loss_scaling is not None), None),
        data=data if any(c.data is not None for c in changes) else None,
        rescales_loss=any(c.rescales_loss for c in changes),
    )


def ranked_by_verification(recommendations):
    """Verified fixes first, then those not tried, then those tried that did not help; stable within each."""
    rank = {True: 0, None: 1, False: 2}
    return sorted(recommendations, key=lambda rec: rank[rec.verified])


def changes_for(rec, session, report):
    """The Changes that apply `rec` to this run; [] when nanscope cannot apply it itself."""
    fix = FIXES.get(rec.id)
    return fix(rec, session, report) if fix is not None else []


def _lower_learning_rate(rec, session, report):
    lr = report.run.get("optimizer_config", {}).get("learning_rate")
    if report.run.get("learning_rate_schedule"):  # the same schedule, scaled: its shape is part of the run
        from nanscope.learning_rate import scaled_schedule, schedule_of
        from nanscope.optimizers import build_optimizer

        schedule = schedule_of(build_optimizer(session.spec, session.model))
        name = type(schedule).__name__
        return [Change(f"lr/{f}", {"learning_rate": f"{name} x 1/{f}"},
                       {"learning_rate": scaled_schedule(schedule, 1 / f)}) for f in LR_FACTORS]
    return [Change(f"lr/{f}", {"learning_rate": lr / f}, {"learning_rate": lr / f}) for f in LR_FACTORS] if lr else []


def _clip_gradients(rec, session, report):
    threshold = rec.data.get("threshold") or 1.0
    return [Change(f"global_clipnorm={threshold:g}", {"global_clipnorm": threshold},
                   {"global_clipnorm": threshold, "clipnorm": None, "clipvalue": None})]


def _optimizer_epsilon(rec, session, report):
    if "epsilon" not in _optimizer_arguments(session):
        return []
    return [Change(f"epsilon={SAFE_EPSILON:g}", {"epsilon": SAFE_EPSILON}, {"epsilon": SAFE_EPSILON})]


def _loss_scaling(rec, session, report):
    if not _float16_without_loss_scaling(report):
        return []
    return [Change("loss scaling", {"optimizer": "LossScaleOptimizer"}, loss_scaling=True)]


def _repair_outliers(rec, session, report):
    from nanscope.rules.outliers import repaired

    return [Change("repair outlier rows", {"repair": "glitch values -> their column's training median"},
                   data=repaired(session))]


def _bounded_activation(rec, session, report):
    model = relu6_model(session.model)
    return [Change("relu->relu6", {"activation": "relu6"}, model=model)] if model is not None else []


# The rules whose fix nanscope can apply itself and re-run (`--verify`), by rule id: the one
# list of them (a rule not named here stays unverified).
FIXES = {
    "lower-learning-rate": _lower_learning_rate,
    "clip-gradients": _clip_gradients,
    "optimizer-epsilon": _optimizer_epsilon,
    "loss-scaling": _loss_scaling,
    "normalize-targets": lambda rec, session, report: [standardized_targets(session, rec.data.get("output"))],
    "normalize-inputs": lambda rec, session, report: [standardized_inputs(session)],
    "bounded-activation": _bounded_activation,
    "drop-outlier-rows": _repair_outliers,
}


def standardized_targets(session, output=None):
    """A Change that trains on standardised regression targets: of `output`, or of the only output.

    Mean and standard deviation come from the training rows and are applied to the
    validation rows too, as a user would do. The loss is then in standardised units.
    """
    index = next((i for i, o in enumerate(session.loss.outputs) if o.name == output), None)
    y = session.train.y if index is None else session.train.y[index]
    shift, scale = _moments(y)

    def change(data):
        if index is None:
            return replace(data, y=((data.y - shift) / scale).astype(data.y.dtype))
        parts = list(data.y)
        parts[index] = ((parts[index] - shift) / scale).astype(parts[index].dtype)
        return replace(data, y=tuple(parts))

    target = f"y[{output}]" if index is not None else "y"
    return Change(f"standardise {target}", {"standardize": target}, data=change, rescales_loss=True)


def standardized_inputs(session):
    """A Change that trains on standardised input features (per feature, as `keras.layers.Normalization`);
    each input of a model with several is standardised on its own features. Inputs that hold ids (integer
    inputs, inputs that feed an `Embedding`: `inputs.id_inputs`) are left as they are."""
    ids = inputs.ids_of(session.train, session.model.keras_model)
    moments = {label: _moments(part) for label, part in inputs.named(session.train.x)
               if _is_float(part) and label not in ids}

    def standardized(label, part):
        moment = moments.get(label)
        return part if moment is None else ((part - moment[0]) / moment[1]).astype(part.dtype)

    def change(data):
        if not inputs.is_multi(data.x):
            return replace(data, x=standardized("x", data.x))
        keys = list(data.x) if isinstance(data.x, dict) else range(len(data.x))
        x = {k: standardized(label, part) for k, (label, part) in zip(keys, inputs.named(data.x))}
        return replace(data, x=x if isinstance(data.x, dict) else tuple(x.values()))

    return Change("standardise x", {"standardize": "x"}, data=change)


def _is_float(array):
    return np.issubdtype(array.dtype, np.floating)


def _moments(array):
    """Per last-axis feature: (mean, std) over every other axis, NaN-aware, std 0 taken as 1."""
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns
        values = array.astype(np.float64)
        axes = tuple(range(values.ndim - 1)) or None
        shift, scale = np.nanmean(values, axis=axes), np.nanstd(values, axis=axes)
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return np.nan_to_num(shift), scale


def _float16_without_loss_scaling(report):
    """True when some layer computes in float16 and the run's optimizer does not scale the loss."""
    dtypes = (report.run.get("layer_dtypes") or {}).values()
    return "float16" in dtypes and not report.run.get("loss_scaling")


def _optimizer_arguments(session):
    spec = session.spec.train.optimizer
    if spec is None:
        return set()
    from nanscope.optimizers import build_optimizer

    return set(build_optimizer(session.spec, session.model).get_config())


def relu6_model(loaded):
    """A clone of a Sequential/functional Keras model with every relu made relu6, weights copied; None if not
    possible."""
    _tf, keras = tensorflow()
    model = loaded.keras_model
    if model is None or not _has_relu(model):
        return None

    def clone_layer(layer):
        config = layer.get_config()
        if config.get("activation") == "relu":
            config["activation"] = "relu6"
        if type(layer).__name__ == "ReLU" and config.get("max_value") is None:
            config["max_value"] = 6.0
        return type(layer).from_config(config)

    try:
        clone = keras.models.clone_model(model, clone_function=clone_layer)
        clone.set_weights(model.get_weights())
    except Exception:  # subclassed models cannot be cloned: the fix is then not automatically applicable
        return None
    from nanscope.models import from_keras

    return from_keras(clone, f"{loaded.description} with relu6")


def _has_relu(model):
    for layer in flatten_layers(model):
        config = layer.get_config() if hasattr(layer, "get_config") else {}
        if config.get("activation") == "relu" or type(layer).__name__ == "ReLU":
            return True
    return False


def _baseline(report):
    history = report.history
    losses = history.column("loss") if history is not None else np.empty(0)
    phases = history.phases() if history is not None else np.empty(0, np.int64)
    finite = losses[(phases == 0) & np.isfinite(losses)]
    return {
        "finite": report.first_nonfinite is None,
        "final_loss": float(losses[-1]) if len(losses) else None,
        "best_loss": float(finite.min()) if len(finite) else None,
        "steps_run": len(losses),
        "start_loss": float(losses[0]) if len(losses) else None,
    }


def _row(result, baseline, rescaled=False):
    # A fix helps when it ends below the unfixed run: below its final loss, or, when that
    # was not finite, below the loss it started from (a fix that merely diverges slower does not help).
    # A fix that changes the loss's units (standardised targets) must end below its own first loss.
    reference = baseline["final_loss"] if baseline["finite"] else baseline["start_loss"]
    if rescaled:
        reference = result.first_loss
    better = reference is None or not math.isfinite(reference) or (
        result.final_loss is not None and math.isfinite(result.final_loss) and result.final_loss < reference)
    return {
        "fix": result.name, "params": result.params, "finite": result.finite,
        "first_nonfinite_step": result.first_nonfinite_step, "steps_run": result.steps_run,
        "final_loss": result.final_loss, "best_loss": result.best_loss, "val_loss": result.val_loss,
        "unfixed_finite": baseline["finite"], "unfixed_final_loss": baseline["final_loss"],
        "unfixed_best_loss": baseline["best_loss"],
        # A run that stayed finite only because loss scaling skipped its updates trained nothing: no help.
        "skipped_updates": result.skipped_updates, "stalled": result.stalled,
        "helped": bool(result.finite and better and not result.stalled),
    }
