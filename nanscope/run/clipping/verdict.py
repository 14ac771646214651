"""The verdict: which strategy to use, why, and the YAML or code that sets it.

A strategy qualifies when its run stayed finite, its clipping was not shown to be
ignored, and it learned: its loss ends below the trivial baseline (the loss of a
constant prediction, `clipping/baseline.py`). Qualifying strategies are ranked by
validation loss after the last step (training loss at the last step when the spec
has no validation part). When none qualifies, the verdict says why clipping cannot
help (or, when strategies stayed finite without learning, that clipping only hides
the problem) and points to trace-steps' diagnosis.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nanscope.run.clipping.baseline import Baseline
    from nanscope.run.clipping.result import ClippingReport, StrategyRun
    from nanscope.run.clipping.strategies import Strategy

# Phases where the first non-finite value appears before any gradient exists:
# clipping only changes the update, so it cannot prevent these.
BEFORE_GRADIENTS = ("data", "forward", "loss")


def decide(report: ClippingReport) -> None:
    """Fill `recommended`, `recommendations`, `diagnosis` and `hides_problem` of a ClippingReport."""
    finite = [run for run in report.runs if _stays_finite(run)]
    ranked = sorted((run for run in finite if _learns(run, report.baseline)), key=_score)
    report.recommendations = [_recommendation(run, report, rank) for rank, run in enumerate(ranked)]
    report.recommended = ranked[0].strategy.name if ranked else None
    report.hides_problem = bool(finite) and not ranked
    if ranked:
        return
    if report.hides_problem:
        report.diagnosis = _clipping_hides_it(report, finite)
    elif report.interrupted:
        report.diagnosis = _interrupted(report)
    else:
        report.diagnosis = _why_nothing_helps(report)


def _stays_finite(run: StrategyRun) -> bool:
    return run.result.finite and run.took_effect is not False and run.result.steps_run > 0


def _learns(run: StrategyRun, baseline: Baseline | None) -> bool:
    # A run that loss scaling kept from updating stays finite without learning anything.
    return not run.result.stalled and (baseline is None or baseline.beaten_by(_metric(run)[1]))


def _metric(run: StrategyRun) -> tuple[str, float | None]:
    """("validation loss" | "training loss", value) a strategy is ranked by."""
    if run.result.val_loss is not None:
        return "validation loss", run.result.val_loss
    return "training loss", run.result.final_loss


def _score(run: StrategyRun) -> float:
    _, value = _metric(run)
    return value if value is not None and math.isfinite(value) else math.inf


def _recommendation(run: StrategyRun, report: ClippingReport, rank: int) -> dict[str, Any]:
    metric, value = _metric(run)
    strategy = run.strategy
    unclipped = next((r for r in report.runs if r.strategy.kind == "none"), None)
    why = [f"stayed finite for all {run.result.steps_run} steps; {metric} {value:.4g}"
           + (" (lowest of the strategies that stayed finite)" if rank == 0 else "")]
    if run.result.skipped_updates:
        why.append(f"the LossScaleOptimizer skipped {run.result.skipped_updates} of its updates (scaled gradients "
                   "overflowed float16 and its scale was halved): loss scaling at work, not failures")
    if report.baseline is not None:
        why.append(f"it learned: below the trivial baseline {report.baseline.value:.4g} ({report.baseline.how}, "
                   f"{report.baseline.rows} rows)")
    if unclipped is not None and not unclipped.result.finite and strategy.kind != "none":
        why.append(f"without clipping the run went non-finite at step {unclipped.result.first_nonfinite_step}")
    if strategy.kind == "none":
        why.append("the unclipped run stays finite: clipping is not needed here")
    else:
        why.append(f"threshold {strategy.threshold:g}: {strategy.threshold_source}")
        if run.effect.clipped_fraction is not None:
            steps = "of the steps whose update was applied" if run.result.skipped_updates else "of the steps"
            why.append(f"clipping was active on {run.effect.clipped_fraction:.0%} {steps}, removing on average "
                       f"{run.effect.norm_removed:.0%} of the gradient norm where it was")
        if run.optimizer_check is not None:
            why.append(run.optimizer_check.detail)
    yaml_text, code = fix_snippets(strategy, report.run.get("optimizer"), report.run.get("loss_scaling", False))
    return {"name": strategy.name, "metric": metric, "value": value, "why": why, "yaml": yaml_text, "code": code}


APPLY_GRADIENTS = "optimizer.apply_gradients(zip(grads, model.trainable_variables))"
APPLY_SCALED_GRADIENTS = ("optimizer.apply_gradients(zip([g * optimizer.dynamic_scale for g in grads], "
                          "model.trainable_variables))")


def fix_snippets(strategy: Strategy, optimizer: Any, loss_scaling: bool = False) -> tuple[str, str | None]:
    """(YAML for the run spec, Python for a training script) that apply `strategy`.

    Under loss scaling (`loss_scaling`) the script's gradients are those of the scaled loss: a manual clip
    unscales them first, and a Keras option goes on the optimizer inside the LossScaleOptimizer, which
    unscales before its inner optimizer clips.
    """
    threshold = f"{strategy.threshold:g}" if strategy.threshold is not None else None
    name = optimizer.get("name", "sgd") if isinstance(optimizer, dict) else "sgd"
    # A compiled model's optimizer is described in words, not as arguments: there are none to carry over.
    arguments = optimizer.items() if isinstance(optimizer, dict) else ()
    keras_args = ", ".join(f"{k}={v!r}" for k, v in arguments
                           if k != "name" and v is not None and k not in ("clipnorm", "global_clipnorm", "clipvalue"))
    cls = {"sgd": "SGD", "adam": "Adam", "adamw": "AdamW", "rmsprop": "RMSprop"}.get(name.lower(), name)
    if strategy.kind == "none":
        return "train:\n  optimizer: {...}   # leave clipnorm, global_clipnorm and clipvalue unset", None
    if strategy.is_keras_option:
        option = strategy.kind
    elif strategy.kind == "manual_clip_by_norm":
        option = "clipnorm"
    else:
        option = "global_clipnorm"
    yaml_text = f"train:\n  optimizer: {{{option}: {threshold}}}"
    if strategy.kind == "manual_clip_by_norm":
        code = f"grads = [tf.clip_by_norm(g, {threshold}) for g in grads]\n{APPLY_GRADIENTS}"
    elif strategy.kind in ("manual_clip_by_global_norm", "auto"):
        code = f"grads, _ = tf.clip_by_global_norm(grads, {threshold})\n{APPLY_GRADIENTS}"
    else:
        code = f"optimizer = keras.optimizers.{cls}({keras_args + ', ' if keras_args else ''}{option}={threshold})"
        if loss_scaling:
            code += "\noptimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # unscales, then the inner one clips"
    if loss_scaling and not strategy.is_keras_option:
        code = ("# grads of optimizer.scale_loss(loss) are scaled: clip them unscaled\n"
                "grads = [g / optimizer.dynamic_scale for g in grads]\n"
                + code.replace(APPLY_GRADIENTS, APPLY_SCALED_GRADIENTS))
    return yaml_text, code


def _clipping_hides_it(report: ClippingReport, finite: list[StrategyRun]) -> str:
    best = min(finite, key=_score)
    metric, value = _metric(best)
    baseline, spec = report.baseline, report.run.get("spec") or "SPEC"
    # Without a baseline a finite run fails to learn only by stalling: loss scaling skipped its updates.
    why = (f"no better than the trivial baseline {baseline.value:.4g} ({baseline.how})" if baseline is not None
           else "its updates skipped by loss scaling, so no weight changed")
    return (
        f"{len(finite)} strateg{'y' if len(finite) == 1 else 'ies'} stayed finite, but none learned: the best, "
        f"{best.strategy.name}, ended with {metric} {value:.4g}, {why}. Clipping only hides the problem here: it "
        f"keeps the weights finite while the model learns nothing. Run `nanscope trace-steps {spec}` for the diagnosis "
        "(e.g. scale the targets or the inputs, lower the learning rate, repair bad rows)."
    )


def _interrupted(report: ClippingReport) -> str:
    finished = sum(1 for run in report.runs if run.result.steps_run)
    return (f"interrupted before a strategy could be recommended: {finished} strateg"
            f"{'y' if finished == 1 else 'ies'} ran, none finished finite; no verdict on the others")


def _why_nothing_helps(report: ClippingReport) -> str:
    unclipped = next((r for r in report.runs if r.strategy.kind == "none"), report.runs[0] if report.runs else None)
    if unclipped is None or not unclipped.result.steps_run:
        return "no strategy ran a step"
    step, phase = unclipped.result.first_nonfinite_step, unclipped.result.first_nonfinite_phase
    spec = report.run.get("spec") or "SPEC"
    if phase in BEFORE_GRADIENTS:
        return (
            f"every strategy went non-finite; without clipping the first non-finite value appears at step {step} "
            f"in the {phase} phase, before any gradient exists, so clipping cannot prevent it (e.g. a log of zero, "
            f"a division by zero, bad data). Run `nanscope trace-steps {spec}` for the layer and the fix."
        )
    return (
        "every strategy went non-finite, clipped or not: bounding the gradient is not enough here. "
        f"Run `nanscope trace-steps {spec}` for the diagnosis (e.g. lower the learning rate, scale the targets)."
    )
