"""compare-clipping's verdict: which strategies qualify (finite, clipping not ignored, below 0.99 x the trivial
baseline), how they rank (validation loss, else training loss), and why none helps when none qualifies."""

import math

import pytest

from nanscope.run.clipping.baseline import Baseline
from nanscope.run.clipping.compare import ClippingReport, StrategyRun
from nanscope.run.clipping.effect import StepEffect
from nanscope.run.clipping.strategies import Strategy
from nanscope.run.clipping.verdict import decide
from nanscope.engine.records import StepRecord, VariableStats
from nanscope.run.experiment import ExperimentResult
from nanscope.store.history import StepHistory


def result(losses, val_loss=None, first_bad=None, phase=None):
    history = StepHistory(0, 1)
    for number, loss in enumerate(losses):
        history.add(StepRecord(step=number, batch_rows=8, loss=loss, data_loss=loss, grad_global_norm=1.0,
                               applied_grad_global_norm=1.0, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                               loss_nonfinite=not math.isfinite(loss), grad_nonfinite=0, weights_nonfinite=0,
                               variables=[VariableStats(1.0, 0, 1.0, 1e-3, 0)]))
    return ExperimentResult(name="r", params={}, history=history, first_nonfinite_step=first_bad,
                            final_loss=losses[-1], best_loss=min(losses), val_loss=val_loss,
                            first_nonfinite_phase=phase)


def run(kind, losses, val_loss=None, threshold=1.0, bit=0, within=0, **bad):
    strategy = Strategy(kind, None if kind == "none" else threshold)
    return StrategyRun(strategy, result(losses, val_loss, **bad), StepEffect(0.5 if bit else None, 0.1, bit, within))


def verdict(runs, baseline=10.0):
    report = ClippingReport(run={"spec": "s.yaml", "optimizer": {"name": "adam"}}, runs=runs, thresholds={},
                            baseline=Baseline(baseline, "validation", "predicting the mean") if baseline else None)
    decide(report)
    return report


@pytest.mark.parametrize("loss, learns", [
    pytest.param(9.9, False, id="at-0.99-of-the-baseline"),
    pytest.param(math.nextafter(9.9, 0), True, id="below-0.99"),
    pytest.param(10.0, False, id="at-the-baseline"),
])
def test_a_strategy_learns_below_0_99_of_the_trivial_baseline(loss, learns):
    report = verdict([run("clipnorm", [12.0, loss], val_loss=loss)])
    assert report.recommended == ("clipnorm=1" if learns else None)
    assert report.hides_problem is (not learns)  # finite without learning: clipping only hides the problem


def test_qualifying_strategies_rank_by_validation_loss_else_training_loss():
    runs = [run("clipnorm", [5.0, 1.0], val_loss=3.0), run("clipvalue", [5.0, 4.0], val_loss=2.0),
            run("global_clipnorm", [5.0, 0.5]), run("auto", [5.0, math.nan], first_bad=1, phase="backward")]
    report = verdict(runs)
    # global_clipnorm has no validation loss: its training loss 0.5 ranks it first; auto went non-finite.
    assert [r["name"] for r in report.recommendations] == ["global_clipnorm=1", "clipvalue=1", "clipnorm=1"]
    assert [(r["metric"], r["value"]) for r in report.recommendations] == [
        ("training loss", 0.5), ("validation loss", 2.0), ("validation loss", 3.0)]
    assert report.recommended == "global_clipnorm=1" and report.diagnosis is None


def test_a_strategy_whose_clipping_was_ignored_does_not_qualify():
    ignored = run("clipnorm", [5.0, 1.0], bit=3, within=2)  # 1 of the 3 steps it bit used an unclipped gradient
    honoured = run("clipvalue", [5.0, 2.0], bit=3, within=3)
    assert [r["name"] for r in verdict([ignored, honoured]).recommendations] == ["clipvalue=1"]


def test_without_a_baseline_every_finite_strategy_learns():
    assert verdict([run("clipnorm", [5.0, 50.0])], baseline=None).recommended == "clipnorm=1"


@pytest.mark.parametrize("phase, before_gradients", [("data", True), ("forward", True), ("loss", True),
                                                      ("backward", False), ("update", False)])
def test_when_every_strategy_fails_the_diagnosis_says_whether_clipping_could_have_helped(phase, before_gradients):
    runs = [run("none", [5.0, math.nan], first_bad=1, phase=phase),
            run("clipnorm", [5.0, math.nan], first_bad=1, phase=phase)]
    report = verdict(runs)
    assert report.recommended is None and not report.hides_problem
    assert ("before any gradient exists" in report.diagnosis) == before_gradients
    if before_gradients:
        assert f"at step 1 in the {phase} phase" in report.diagnosis


def test_verified_fixes_rank_first_then_untried_then_failed_each_in_diagnosis_order():
    from nanscope.rules.catalogue import recommend
    from nanscope.run.verify import ranked_by_verification

    recs = [recommend(rule, "error", []) for rule in ("stable-log", "clip-gradients", "lower-learning-rate",
                                                      "normalize-targets", "safe-division")]
    for rec, verified in zip(recs, (False, None, True, False, None)):
        rec.verified = verified
    assert [r.id for r in ranked_by_verification(recs)] == [
        "lower-learning-rate", "clip-gradients", "safe-division", "stable-log", "normalize-targets"]
