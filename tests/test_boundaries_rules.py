"""Every named threshold of the step rules, just below, at and just above, on minimal runs.

The thresholds are written out here as the rules document them (rules/ and docs/rules/),
not imported: a changed constant or a flipped comparison fails one of these tables. A
threshold on a fitted rate (a least-squares growth factor) has no exact "at": it is checked
just below and just above. The step history keeps every step's scalars as float32, so a
threshold read from those columns is met at the nearest float32 (`up32`).
"""

import math

import numpy as np
import pytest

from boundary_runs import down, fired, first_at, ranked, report_of, step, up, up32
from nanscope.rules.evidence import FeatureScale, RunEvidence, TargetScale


def geometric(n, rate, start=1.0):
    """`n` values growing `rate`x a step."""
    return [start * rate ** s for s in range(n)]


def reaching(n, total):
    """`n` values growing geometrically from 1 to exactly `total`."""
    return [1.0 if s == 0 else total if s == n - 1 else total ** (s / (n - 1)) for s in range(n)]


# clip-gradients: the global gradient norm grows > 1.2x a step (fitted), over >= 4 healthy steps, > 100x overall.
GRADIENT_GROWTH = [
    pytest.param(geometric(30, 1.19), False, id="rate-1.19-below-1.2"),
    pytest.param(geometric(30, 1.21), True, id="rate-1.21-above-1.2"),
    pytest.param(reaching(5, 99.99), False, id="total-below-100"),
    pytest.param(reaching(5, 100.0), False, id="total-at-100"),
    pytest.param(reaching(5, up32(100.0)), True, id="total-above-100"),
    pytest.param(geometric(3, 20.0), False, id="3-steps-below-4"),
    pytest.param(geometric(4, 20.0), True, id="4-steps-at-4"),
]


@pytest.mark.parametrize("norms, fires", GRADIENT_GROWTH)
def test_clip_gradients_growth_thresholds(norms, fires):
    report = report_of([step(s, grad=g) for s, g in enumerate(norms)])
    rec = fired(report).get("clip-gradients")
    assert (rec is not None) == fires
    if fires:  # a pure geometric rise: its rate, from its first step
        assert rec.data["onset_step"] == 0 and rec.severity == "warning"
        assert rec.data["growth_rate"] == pytest.approx(norms[1] / norms[0], rel=1e-5)


def test_clip_gradients_reads_the_healthy_steps_only_and_is_an_error_in_a_run_that_failed():
    records = [step(s, grad=g) for s, g in enumerate(geometric(4, 20.0))]
    records.append(step(4, grad=math.inf, loss=math.inf, loss_nonfinite=True))  # the failure itself: no growth point
    rec = fired(report_of(records, first_at(4, "loss")))["clip-gradients"]
    assert rec.severity == "error" and rec.data["onset_step"] == 0
    # 8000 at step 3, growing 20x a step: float32's max 3.4e38 / 8000 = 20^26.4, so around step 29.4.
    float32_max = 3.4028234663852886e38
    assert rec.data["projected_overflow_step"] == pytest.approx(3 + math.log(float32_max / 8000) / math.log(20))


# lower-learning-rate from the loss (rules/early.py): > 1.2x a step (fitted), >= 4 healthy steps, > 100x overall,
# unless the weights hardly move (median |dw|/|w| after the first step below 1e-5).
LOSS_GROWTH = [
    pytest.param(geometric(30, 1.19), 1e-3, False, id="rate-1.19"),
    pytest.param(geometric(30, 1.21), 1e-3, True, id="rate-1.21"),
    pytest.param(reaching(5, 100.0), 1e-3, False, id="total-at-100"),
    pytest.param(reaching(5, up32(100.0)), 1e-3, True, id="total-above-100"),
    pytest.param(geometric(3, 20.0), 1e-3, False, id="3-steps"),
    pytest.param(geometric(4, 20.0), 1e-3, True, id="4-steps"),
    pytest.param(geometric(4, 20.0), 0.9e-5, False, id="update-ratio-below-1e-5"),
    pytest.param(geometric(4, 20.0), 1e-5, False, id="update-ratio-at-1e-5"),  # float32(1e-5) is just below it
    pytest.param(geometric(4, 20.0), up32(1e-5), True, id="update-ratio-above-1e-5"),
]


@pytest.mark.parametrize("losses, ratio, fires", LOSS_GROWTH)
def test_loss_growth_thresholds(losses, ratio, fires):
    report = report_of([step(s, loss=value, update_ratio=ratio) for s, value in enumerate(losses)])
    rec = fired(report).get("lower-learning-rate")
    assert (rec is not None) == fires
    if fires:
        assert rec.data["onset_step"] == 0
        assert rec.data["loss_growth_rate"] == pytest.approx(losses[1] / losses[0], rel=1e-5)


# lower-learning-rate from the update ratio: median |dw|/|w| over the healthy steps after the first > 1e-2,
# over at least 2 of them.
UPDATE_RATIO = [
    pytest.param([0.5, 0.009, 0.009], False, id="below-1e-2"),
    pytest.param([0.5, 0.01, 0.01], False, id="at-1e-2"),  # float32(0.01) is just below 0.01
    pytest.param([0.5, up32(0.01), up32(0.01)], True, id="above-1e-2"),
    pytest.param([0.5, 0.02], False, id="one-ratio-after-the-first"),
    pytest.param([0.5, 0.001, 0.001], False, id="the-first-step-does-not-count"),
    pytest.param([0.001, 0.02, 0.02, 0.001], True, id="median-of-0.02-and-0.02-and-0.001"),
]


@pytest.mark.parametrize("ratios, fires", UPDATE_RATIO)
def test_update_ratio_thresholds(ratios, fires):
    report = report_of([step(s, update_ratio=r) for s, r in enumerate(ratios)])
    rec = fired(report).get("lower-learning-rate")
    assert (rec is not None) == fires
    if fires:
        assert rec.data["median_update_ratio"] == pytest.approx(float(np.median(np.float32(ratios[1:]))))
        assert rec.fix == "train:\n  optimizer: {learning_rate: 0.001}   # 10x lower"  # lr 0.01 / 10


# The update-ratio finding is only info while the loss falls: the mean of its last third below 0.98 x that of
# its first third, over at least 6 healthy steps.
LOSS_FALLING = [
    pytest.param([1, 1, 1, 1, 0.97, 0.97], "info", id="below-0.98"),
    pytest.param([1, 1, 1, 1, 0.98, 0.98], "warning", id="at-0.98"),  # float32(0.98) is just above 0.98
    pytest.param([1, 1, 1, 1, 0.99, 0.99], "warning", id="above-0.98"),
    pytest.param([1, 1, 1, 0.1, 0.1], "warning", id="5-steps-too-few"),
    pytest.param([1, 1, 1, 1, 0.1, 0.1], "info", id="6-steps"),
]


@pytest.mark.parametrize("losses, severity", LOSS_FALLING)
def test_update_ratio_severity_follows_the_loss(losses, severity):
    report = report_of([step(s, loss=value, update_ratio=0.05) for s, value in enumerate(losses)])
    assert fired(report)["lower-learning-rate"].severity == severity


def test_update_ratio_is_an_error_in_a_run_that_failed():
    records = [step(s, update_ratio=0.05) for s in range(3)] + [step(3, loss=math.nan, loss_nonfinite=True)]
    assert fired(report_of(records, first_at(3)))["lower-learning-rate"].severity == "error"


# weight-constraint: >= 8 healthy steps, the weight norm > 10x its first, and not falling over the last quarter
# (at least 2 steps) of them.
WEIGHT_GROWTH = [
    pytest.param(list(np.linspace(1, 10, 8)), False, id="at-10x"),
    pytest.param([*np.linspace(1, 10, 7), up32(10.0)], True, id="above-10x"),
    pytest.param(list(np.linspace(1, 9.99, 8)), False, id="below-10x"),
    pytest.param(list(np.linspace(1, 100, 7)), False, id="7-steps"),
    pytest.param(list(np.linspace(1, 100, 8)), True, id="8-steps"),
    pytest.param([1, 2, 3, 4, 5, 6, 60, 50], False, id="falls-in-the-last-2-of-8"),
    pytest.param([1, 2, 3, 4, 5, 60, 50, 55], True, id="falls-before-the-last-2-of-8"),
    pytest.param([1, 2, 3, 4, 5, 6, 7, 8, 60, 50, 55, 56], True, id="falls-before-the-last-3-of-12"),
    pytest.param([1, 2, 3, 4, 5, 6, 7, 8, 50, 60, 55, 56], False, id="falls-in-the-last-3-of-12"),
]


@pytest.mark.parametrize("norms, fires", WEIGHT_GROWTH)
def test_weight_growth_thresholds(norms, fires):
    report = report_of([step(s, weight_norm=float(w)) for s, w in enumerate(norms)])
    rec = fired(report).get("weight-constraint")
    assert (rec is not None) == fires
    if fires:
        assert (rec.data["first"], rec.data["last"]) == (1.0, float(np.float32(norms[-1])))


# weight-constraint ranks above clip-gradients (0.85 against 0.8) when the loss is below 0 and its mean over the last
# quarter of the healthy steps is at least twice (as negative as) that of the quarter before: no minimum to reach.
UNBOUNDED_LOSS = [
    pytest.param([0.1, 0.0, -0.5, -0.5, -1.0, -1.0, -2.0, -2.0], True, id="twice-the-quarter-before"),
    pytest.param([0.1, 0.0, -0.5, -0.5, -1.0, -1.0, -1.99, -1.99], False, id="below-twice"),
    pytest.param([0.1, 0.0, -0.5, -0.5, 0.0, 0.0, -2.0, -2.0], False, id="the-quarter-before-at-0"),
    pytest.param([4.0, 3.0, 2.0, 1.0, 0.5, 0.5, 0.25, 0.25], False, id="positive-and-halving"),
]


@pytest.mark.parametrize("losses, unbounded", UNBOUNDED_LOSS)
def test_weight_growth_with_a_loss_falling_without_bound_ranks_above_the_gradient(losses, unbounded):
    norms, grads = np.linspace(1, 100, 8), [2.0 ** s for s in range(8)]
    report = report_of([step(s, loss=loss, grad=g, weight_norm=float(w))
                        for s, (loss, g, w) in enumerate(zip(losses, grads, norms))])
    order = ranked(report)
    assert order[:2] == (["weight-constraint", "clip-gradients"] if unbounded else
                         ["clip-gradients", "weight-constraint"]), order
    rec = fired(report)["weight-constraint"]
    assert rec.data.get("unbounded_loss", False) is unbounded
    if unbounded:
        assert rec.evidence[-1].startswith("the loss fell below 0 and keeps falling with them (mean -1, then -2 ")


def scale_evidence(std, mean=0.0, loss="mse", feature_std=None):
    targets = [TargetScale(None, loss, std, mean)]
    features = [FeatureScale("a", 0, feature_std, 0.0)] if feature_std is not None else []
    return RunEvidence(targets=targets, features=features)


# normalize-targets / normalize-inputs: std or mean |y| > 10 (under an MSE-like loss for targets).
SCALE = [
    pytest.param(down(10.0), 0.0, "mse", False, id="std-below-10"),
    pytest.param(10.0, 0.0, "mse", False, id="std-at-10"),
    pytest.param(up(10.0), 0.0, "mse", True, id="std-above-10"),
    pytest.param(1.0, 10.0, "mse", False, id="mean-at-10"),
    pytest.param(1.0, up(10.0), "mse", True, id="mean-above-10"),
    pytest.param(100.0, 0.0, "mean_absolute_error", True, id="mae-is-mse-like"),
    pytest.param(100.0, 0.0, "huber", True, id="huber-is-mse-like"),
    pytest.param(100.0, 0.0, "categorical_crossentropy", False, id="crossentropy-is-not"),
    pytest.param(math.nan, math.nan, "mse", False, id="nothing-finite-measured"),
]


@pytest.mark.parametrize("std, mean, loss, fires", SCALE)
def test_target_scale_thresholds(std, mean, loss, fires):
    rec = fired(report_of([step(0)]), scale_evidence(std, mean, loss)).get("normalize-targets")
    assert (rec is not None) == fires
    if fires:
        assert rec.severity == "info" and (rec.data["y_std"], rec.data["y_mean_abs"]) == (std, mean)


@pytest.mark.parametrize("std, fires", [(10.0, False), (up(10.0), True)])
def test_input_scale_threshold(std, fires):
    rec = fired(report_of([step(0)]), RunEvidence(features=[FeatureScale("a", 0, std, 0.0),
                                                            FeatureScale("b", 1, 1.0, 0.0)])).get("normalize-inputs")
    assert (rec is not None) == fires
    if fires:
        assert rec.data["features"] == [0]
        assert rec.evidence == [f"1 input feature(s) far from unit scale: a (std {std:.3g})"]


# The severity of a scale rule: info in a finite run; warning in a failed one; error only past std 1000 in a run
# that failed outside the data phase (at step 5, past the first 5 steps where the scale is the root cause:
# tests/test_rules_root_cause.py).
SCALE_SEVERITY = [
    pytest.param(None, 2000.0, "info", id="finite-run"),
    pytest.param("forward", 1000.0, "warning", id="at-1000"),
    pytest.param("forward", up(1000.0), "error", id="above-1000"),
    pytest.param("loss", up(1000.0), "error", id="loss-phase"),
    pytest.param("data", 2000.0, "warning", id="data-phase"),
]


@pytest.mark.parametrize("phase, std, severity", SCALE_SEVERITY)
def test_scale_severity(phase, std, severity):
    first = first_at(5, phase) if phase else None
    records = [step(0)] + ([step(5, loss=math.nan, loss_nonfinite=True)] if phase else [])
    found = fired(report_of(records, first), scale_evidence(std, feature_std=std))
    assert (found["normalize-targets"].severity, found["normalize-inputs"].severity) == (severity, severity)


@pytest.mark.parametrize("std, order", [
    (1000.0, ["lower-learning-rate", "normalize-targets"]),  # targets score 0.7 < the update ratio's 0.75
    (up(1000.0), ["normalize-targets", "lower-learning-rate"]),  # past 1000 (extreme) they score 0.8
])
def test_an_extreme_target_scale_outranks_the_update_ratio(std, order):
    records = [step(s, update_ratio=0.05) for s in range(5)] + [step(5, loss=math.nan, loss_nonfinite=True)]
    assert ranked(report_of(records, first_at(5, "forward")), scale_evidence(std)) == order


def test_findings_above_info_come_first_then_by_score():
    # normalize-targets (info in a finite run, 0.8) after lower-learning-rate (warning, 0.75).
    records = [step(s, update_ratio=0.05) for s in range(3)]
    assert ranked(report_of(records), scale_evidence(2000.0)) == ["lower-learning-rate", "normalize-targets"]


def test_clean_input_data_fires_on_the_data_phase_only_and_ranks_first():
    records = [step(0, update_ratio=0.05), step(1, update_ratio=0.05), step(2, update_ratio=0.05)]
    data = fired(report_of(records, first_at(2, "data", detail=["x: 1 non-finite value(s)"])), scale_evidence(2000.0))
    assert next(iter(data)) == "clean-input-data" and data["clean-input-data"].data == {"step": 2}
    assert data["clean-input-data"].evidence == ["step 2: the batch itself holds non-finite values",
                                                 "x: 1 non-finite value(s)"]
    for phase in ("forward", "loss", "backward", "update"):
        assert "clean-input-data" not in fired(report_of(records, first_at(2, phase)))


# float16 layers (rules/precision.py): output max |x| > 65504 / 2 overflows on the next doubling; more than a tenth
# of the non-zero outputs below float16's smallest normal underflow.
FLOAT16_OVERFLOW = [
    pytest.param(down(32752.0), False, id="below-half-of-max"),
    pytest.param(32752.0, False, id="at-half-of-max"),
    pytest.param(up(32752.0), True, id="above-half-of-max"),
]


@pytest.mark.parametrize("peak, fires", FLOAT16_OVERFLOW)
@pytest.mark.parametrize("loss_scaling", [False, True])
def test_float16_overflow_threshold(peak, fires, loss_scaling):
    # A layer's output is a forward value: loss scaling (it multiplies the gradients) cannot keep it below 65504,
    # with or without a LossScaleOptimizer, so the finding is float32-layer's.
    report = report_of([step(0, layer_max=(1.0, peak))], dtype="float16", loss_scaling=loss_scaling)
    rec = fired(report).get("float32-layer")
    assert "loss-scaling" not in fired(report)
    assert (rec is not None) == fires
    if fires:
        assert rec.severity == "warning" and rec.data == {"layer": "head", "max_abs": peak}


FLOAT16_UNDERFLOW = [
    pytest.param(0.0, False, id="none"),
    pytest.param(down(0.1), False, id="below-a-tenth"),
    pytest.param(0.1, False, id="at-a-tenth"),
    pytest.param(up(0.1), True, id="above-a-tenth"),
    pytest.param(1.0, True, id="all"),
]


@pytest.mark.parametrize("fraction, fires", FLOAT16_UNDERFLOW)
def test_float16_underflow_threshold(fraction, fires):
    report = report_of([step(0, underflow=fraction)], dtype="float16")
    rec = fired(report).get("loss-scaling")
    assert (rec is not None) == fires
    if fires:
        assert rec.data == {"layer": "hidden", "underflow_fraction": fraction}
    # With loss scaling already on, scaling again cannot be the fix; and float32 layers never underflow float16.
    assert "loss-scaling" not in fired(report_of([step(0, underflow=fraction)], dtype="float16", loss_scaling=True))
    assert "loss-scaling" not in fired(report_of([step(0, underflow=fraction)], dtype="float32"))


F, T = False, True
# A collapsed loss scale (float32-layer with a LossScaleOptimizer in use): over the last 20 scaled steps after the
# warm-up (at least 5 of them), at least 80% skipped. The warm-up is the run of skips the run starts with, unless
# it reached 30 steps (every scale from 2^15 to 2^-15 tried), ended or not.
SKIPS = [
    pytest.param([F, T, T, T], None, id="4-steps-below-5"),
    pytest.param([F, T, T, T, T], (4, 5), id="5-steps-80-percent"),
    pytest.param([F, T, T, T, F], None, id="60-percent"),
    pytest.param([F, T, T, T, T, T, T, F], None, id="75-percent"),
    pytest.param([F, T, T, T, T, F], None, id="67-percent"),
    pytest.param([F, T, T, T, T, T], (5, 6), id="83-percent"),
    pytest.param([F, F, F, T, F, F, F, F] + [T] * 15, (16, 20), id="the-last-20-not-19-or-21"),
    pytest.param([T] * 29, None, id="a-warm-up-of-29"),
    pytest.param([T] * 30, (20, 20), id="a-warm-up-of-30-is-kept"),
    pytest.param([T] * 30 + [F], (19, 20), id="a-warm-up-of-30-that-ended-is-kept"),
    pytest.param([T] * 29 + [F], None, id="a-warm-up-of-29-that-ended"),
    pytest.param([T] * 29 + [F] + [T] * 3, None, id="after-a-warm-up-4-steps"),
    pytest.param([T] * 29 + [F] + [T] * 4, (4, 5), id="after-a-warm-up-5-steps"),
]


@pytest.mark.parametrize("skips, found", SKIPS)
def test_collapsed_loss_scale_thresholds(skips, found):
    records = [step(s, loss_scale=2.0 ** (15 - s), skipped=skip) for s, skip in enumerate(skips)]
    rec = fired(report_of(records, dtype="float16", loss_scaling=True)).get("float32-layer")
    assert (None if rec is None else (rec.data["skipped"], rec.data["window"])) == found
    if found:
        assert rec.severity == "error"


def test_a_skip_on_a_step_that_failed_before_its_gradients_does_not_count():
    records = [step(s, loss_scale=1024.0, skipped=s > 0) for s in range(5)]
    assert "float32-layer" in fired(report_of(records, dtype="float16", loss_scaling=True))
    records[-1] = step(4, loss=math.nan, loss_nonfinite=True, loss_scale=1024.0, skipped=True)  # the loss phase
    assert "float32-layer" not in fired(report_of(records, first_at(4), dtype="float16", loss_scaling=True))
    # A run that does not scale its loss skips nothing by loss scaling.
    records = [step(s, skipped=s > 0) for s in range(5)]
    assert "float32-layer" not in fired(report_of(records, dtype="float16", loss_scaling=True))


# bounded-activation: a layer past its dtype's bound is info, not a warning, once the weights' norm at the last
# healthy step is 10x or more its start (the initial norm where known, else the first step's).
GROWING_WEIGHTS = [
    pytest.param([1.0, 5.0, 9.99], None, "warning", id="below-10x"),
    pytest.param([1.0, 5.0, 10.0], None, "info", id="at-10x"),
    pytest.param([1.0, 50.0, 2.0], None, "warning", id="the-last-step-counts"),
    pytest.param([4.0, 5.0, 19.99], 2.0, "warning", id="below-10x-the-initial-norm"),
    pytest.param([4.0, 5.0, 20.0], 2.0, "info", id="at-10x-the-initial-norm"),
]


@pytest.mark.parametrize("norms, initial, severity", GROWING_WEIGHTS)
def test_bounded_activation_is_info_when_the_weights_grew_10x(norms, initial, severity):
    records = [step(s, weight_norm=w, layer_max=(1.0, 1e30)) for s, w in enumerate(norms)]
    evidence = RunEvidence(initial_weight_norm=(lambda: initial) if initial is not None else None)
    rec = fired(report_of(records), evidence)["bounded-activation"]
    assert rec.severity == severity
    weights_line = [line for line in rec.evidence if line.startswith("the weights' norm grew")]
    growth = norms[-1] / (initial or norms[0])
    assert weights_line == ([f"the weights' norm grew {growth:.3g}x over the same steps: the outputs grow because "
                             "the weights do, and bounding the activation does not stop that"]
                            if severity == "info" else [])
