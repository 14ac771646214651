"""Turn a run's measurements into recommendations from the rule catalogue.

Each detector looks at one kind of evidence and returns zero or more
`(score, Recommendation)` pairs; `diagnose` orders them by score, most direct
evidence first. The same evidence always gives the same recommendations, and a
healthy run gets nothing above `info`.
"""

import math

import numpy as np

from nanscope.finishing import optional_part
from nanscope.learning_rate import lowered_learning_rate_fix
from nanscope.rules.catalogue import recommend
from nanscope.rules.early import early_findings
from nanscope.rules.outliers import outlier_findings
from nanscope.rules.precision import precision_findings
from nanscope.rules.trends import geometric_growth
from nanscope.rules.producer import producer_findings

# A gradient norm that grows by more than 20% per step, sustained over at least
# GROWTH_MIN_STEPS steps and by GROWTH_MIN_TOTAL overall, is not noise: healthy
# SGD/Adam runs show norms that wander within a factor of a few.
GROWTH_RATE_LIMIT = 1.2
GROWTH_MIN_STEPS = 4
GROWTH_MIN_TOTAL = 100.0
# Largest finite float32 (numpy.finfo(float32).max): where a growing norm overflows.
FLOAT32_MAX = float(np.finfo(np.float32).max)
# |dw|/|w| around 1e-3 per step is the usual healthy range (Karpathy, "A Recipe for
# Training Neural Networks"); ten times that, sustained, is far above normal.
UPDATE_RATIO_LIMIT = 1e-2
# A run whose late loss is below this fraction of its early loss is making progress. A
# classifier starting at chance (log 2 = 0.69) that reaches 0.62 within 40 steps is
# learning, even if slowly: large Adam steps on a fresh Embedding are how it starts, so
# the update-ratio rule only warns when the loss has not fallen at all.
LOSS_PROGRESS_FRACTION = 0.98
# Inputs or regression targets whose standard deviation or mean magnitude exceeds
# this are far from unit scale (standardised data has std 1, mean 0).
SCALE_LIMIT = 10.0
# A scale a hundred times past the limit dwarfs any learning-rate effect: no rate that suits the
# other weights absorbs gradients scaled by it. Only a spread (std) this large, in a run that went
# non-finite outside the data phase, makes a scale rule an error on its own evidence; an offset
# (a large mean with a small std) is absorbed by a bias and is at most a warning.
EXTREME_SCALE = 100 * SCALE_LIMIT
MSE_LIKE_LOSSES = {"mean_squared_error", "mse", "mean_absolute_error", "mae", "huber", "huber_loss", "log_cosh"}
# Clipping threshold rule: the largest update an SGD-like step may make is about
# this fraction of the weights' norm.
CLIP_UPDATE_FRACTION = 0.01
# AutoClip (Seetharaman et al., 2020) clips at a low percentile of the observed norms.
CLIP_PERCENTILE = 10


def diagnose(report, evidence):
    """Recommendations for a TraceReport, most likely cause first.

    A detector that raises is a bug in nanscope, not in the user's run: its rules are
    left out, `report.notes` names them, and the rest of the report stands.

    Args:
        report: TraceReport.
        evidence: RunEvidence (`rules.evidence`). The model and the training data's scale.
    """
    healthy = healthy_steps(report)
    found = []
    for rule_ids, detector in detectors():
        with optional_part(report.notes, f"rule {', '.join(rule_ids)}"):
            found.extend(detector(report, evidence, healthy))
    # Findings that fired above info come first, then by how directly the evidence implicates
    # them. Stable sort: equal keys keep detector order, so the same evidence gives the same order.
    found.sort(key=lambda pair: (pair[1].severity == "info", -pair[0]))
    by_id, ordered = {}, []
    for _, rec in found:
        if rec.id in by_id:
            by_id[rec.id].evidence.extend(line for line in rec.evidence if line not in by_id[rec.id].evidence)
            continue
        by_id[rec.id] = rec
        ordered.append(rec)
    return ordered


def detectors():
    """(rule ids it can fire, detector) for every detector, in the order their findings tie-break."""
    return (
        (("clean-input-data",), _bad_data),
        (("drop-outlier-rows",), outlier_findings),
        (("masked-softmax", "double-where", "stable-log", "stable-exp", "safe-division", "safe-sqrt", "loss-scaling",
          "float32-layer", "optimizer-epsilon"), producer_findings),
        (("loss-scaling", "float32-layer"), precision_findings),
        (("clip-gradients",), _gradient_growth),
        (("lower-learning-rate",), _update_ratio),
        (("lower-learning-rate", "bounded-activation", "weight-constraint"), early_findings),
        (("normalize-targets",), _target_scale),
        (("normalize-inputs",), _input_scale),
    )


def healthy_steps(report):
    """The report's finite steps (history.Healthy): every one's scalars, and their kept full rows."""
    if report.history is None:
        from nanscope.history import StepHistory

        return StepHistory(0, 0).healthy()
    return report.history.healthy()


def _severity(report, fired_alone="warning"):
    return "error" if report.first_nonfinite is not None else fired_alone


def _bad_data(report, evidence, healthy):
    first = report.first_nonfinite
    if first is None or first.phase != "data":
        return []
    evidence = [f"step {first.step}: the batch itself holds non-finite values", *list(first.detail)]
    return [(1.0, recommend("clean-input-data", "error", evidence, data={"step": first.step}))]


def growth(healthy):
    """(per-step growth factor, onset step) of the gradient norm's geometric rise to the last healthy step, or None."""
    return geometric_growth(healthy.steps, healthy.grad_norm, GROWTH_RATE_LIMIT, GROWTH_MIN_STEPS, GROWTH_MIN_TOTAL)


def _gradient_growth(report, evidence, healthy):
    found = growth(healthy)
    if found is None:
        return []
    rate, onset = found
    last_step, last_norm = int(healthy.steps[-1]), float(healthy.grad_norm[-1])
    start_norm = float(healthy.grad_norm[healthy.steps == onset][0])
    overflow_step = projected_overflow_step(last_step, last_norm, rate)
    initial = evidence.initial_weight_norm  # a run seen only through fit keeps no initial weights
    threshold, how = clip_threshold(healthy.grad_norm, report.run.get("optimizer_config", {}).get("learning_rate"),
                                    initial() if initial is not None else float(healthy.weight_norm[0]))
    evidence = [
        f"gradient norm grew {rate:.2f}x per step from step {onset} "
        f"({start_norm:.3g} -> {last_norm:.3g} at step {last_step})",
        *([f"at that rate it overflows float32 around step {overflow_step:.0f}"] if overflow_step is not None else []),
        f"clip threshold {threshold:.3g}: {how}",
    ]
    fix = f"train:\n  optimizer: {{global_clipnorm: {threshold:.3g}}}   # or clipnorm / clipvalue"
    data = {"growth_rate": rate, "onset_step": onset, "projected_overflow_step": overflow_step,
            "threshold": threshold}
    return [(0.8, recommend("clip-gradients", _severity(report), evidence, fix, data))]


def projected_overflow_step(step, norm, rate):
    """The step at which `norm`, growing `rate`x per step from `step`, passes float32's max; None if it cannot be said.

    A norm of exactly 0 (a run that fits its data perfectly) or a denormal one gives no
    finite projection, and a rate of at most 1 never overflows.
    """
    if not (norm > 0 and math.isfinite(norm) and rate > 1 and math.isfinite(rate)):
        return None
    steps_left = math.log(FLOAT32_MAX / norm) / math.log(rate)
    return step + steps_left if math.isfinite(steps_left) else None


def clip_threshold(grad_norms, lr, weight_norm):
    """A clipping threshold from the healthy steps' global gradient norms, and how it was chosen.

    Args:
        grad_norms: sequence of float. The healthy steps' global gradient norms.
        lr: float or None. The optimizer's learning rate; bounds the threshold so one step moves the weights
            by at most CLIP_UPDATE_FRACTION of their norm.
        weight_norm: float. The norm of the trainable weights before the first step where known, else after the
            first healthy step (which a first step that blew the weights up makes far too large); 0 when unknown.

    Returns:
        (float, str): the threshold, rounded to one significant digit, and why.
    """
    norms = np.asarray(grad_norms, dtype=np.float64)
    norms = norms[np.isfinite(norms)]
    percentile = float(np.percentile(norms, CLIP_PERCENTILE)) if len(norms) else 1.0
    if lr and weight_norm > 0:
        update_bound = CLIP_UPDATE_FRACTION * weight_norm / lr
        if update_bound < percentile:
            return round_threshold(update_bound), (
                f"so that one step of learning rate {lr:g} moves the weights (norm {weight_norm:.3g}) "
                f"by at most {CLIP_UPDATE_FRACTION:.0%}; the {CLIP_PERCENTILE}th percentile of healthy norms, "
                f"{percentile:.3g}, would allow larger steps"
            )
    return round_threshold(percentile), f"the {CLIP_PERCENTILE}th percentile of the healthy steps' gradient norms"


def round_threshold(value):
    """`value` to one significant digit (0.0347 -> 0.03); 1.0 for a value that is not positive and finite."""
    if value <= 0 or not math.isfinite(value):
        return 1.0
    digits = -math.floor(math.log10(value))
    return round(value, digits)


def _update_ratio(report, evidence, healthy):
    ratios = healthy.update_ratio[1:]
    if len(ratios) < 2:
        return []
    median = float(np.median(ratios))
    if median <= UPDATE_RATIO_LIMIT:
        return []
    evidence = [f"median update ratio |dw|/|w| (all weights) over {len(ratios)} healthy steps: {median:.3g} "
                f"(healthy runs: ~1e-3; limit {UPDATE_RATIO_LIMIT:g})"]
    # Large steps while the loss still falls are how small models start: only a finding
    # when the run also failed or stopped making progress.
    severity = _severity(report, "warning" if not _loss_falling(healthy) else "info")
    fix = lowered_learning_rate_fix(report.run) or RULE_FIX_LR
    return [(0.75, recommend("lower-learning-rate", severity, evidence, fix, {"median_update_ratio": median}))]


def _loss_falling(healthy):
    """True when the mean loss over the last third of the healthy steps is below that of the first third."""
    losses = healthy.loss[np.isfinite(healthy.loss)]
    if len(losses) < 6:
        return False
    third = len(losses) // 3
    return float(np.mean(losses[-third:])) < LOSS_PROGRESS_FRACTION * float(np.mean(losses[:third]))


RULE_FIX_LR = "train:\n  optimizer: {learning_rate: 0.001}"


def _target_scale(report, evidence, healthy):
    if evidence.targets is None:  # a run whose targets were not measured
        return []
    found = []
    for target in evidence.targets:
        if target.loss.lower() not in MSE_LIKE_LOSSES or not _far(target.std, target.mean_abs):
            continue  # unit scale, or no finite target to measure (clean-input-data's case)
        name, std, mean = target.output, target.std, target.mean_abs
        whose = f"regression targets of output {name!r}" if name else "regression targets"
        lines = [f"{whose} have std {std:.3g} and mean |y| {mean:.3g} under {target.loss} "
                 f"(unit scale: ~1; limit {SCALE_LIMIT:g}); the loss and its gradients scale with y squared"]
        data = {"y_std": std, "y_mean_abs": mean, **({"output": name} if name else {})}
        score = 0.8 if max(std, mean) > EXTREME_SCALE else 0.7
        found.append((score, recommend("normalize-targets", scale_severity(report, std), lines, data=data)))
    return found


def _far(std, mean_abs):
    """A finite spread or mean magnitude past SCALE_LIMIT; NaN (nothing finite was measured) is not."""
    return math.isfinite(std) and math.isfinite(mean_abs) and max(std, mean_abs) > SCALE_LIMIT


def scale_severity(report, spread):
    """The severity of a scale rule (normalize-inputs, normalize-targets) whose data has std `spread`.

    info in a run that stayed finite; at most a warning when the run went non-finite, since a
    scale explains a divergence only through the gradients it makes; an error only when the run
    went non-finite outside the data phase (a NaN row explains a `data`-phase one) and the spread
    alone is extreme.
    """
    first = report.first_nonfinite
    if first is None:
        return "info"
    return "error" if first.phase != "data" and spread > EXTREME_SCALE else "warning"


def _input_scale(report, evidence, healthy):
    if evidence.features is None:
        return []
    far = [f for f in evidence.features if _far(f.std, f.mean_abs)]
    if not far:
        return []
    largest = sorted(far, key=lambda f: -max(f.std, f.mean_abs))  # the farthest first: those are named
    shown = ", ".join(f"{f.name} (std {f.std:.3g})" for f in largest[:5])
    more = f", and {len(far) - 5} more" if len(far) > 5 else ""
    lines = [f"{len(far)} input feature(s) far from unit scale: {shown}{more}"]
    spread = max(f.std for f in far)
    return [(0.6, recommend("normalize-inputs", scale_severity(report, spread), lines,
                            data={"features": [f.key for f in far if f in largest[:20]]}))]
