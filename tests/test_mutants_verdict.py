"""compare-clipping's verdict, word for word: each qualifying strategy's reasons, and the diagnosis when none
qualifies (clipping hides the problem, the comparison was interrupted, nothing helps before or after the gradient).

These lines are what the user reads to trust the recommendation; each number in them comes from the run, so a
wrong count, step, phase, percentage or plural fails here. Built on minimal histories, no training.
"""

import math

from nanscope.run.clipping.baseline import Baseline
from nanscope.run.clipping.compare import ClippingReport, StrategyRun
from nanscope.run.clipping.effect import OptimizerCheck, StepEffect
from nanscope.run.clipping.strategies import Strategy
from nanscope.run.clipping.verdict import decide
from nanscope.engine.records import StepRecord, VariableStats
from nanscope.run.experiment import ExperimentResult
from nanscope.store.history import StepHistory

TRACE = "Run `nanscope trace-steps s.yaml` for the diagnosis"
BASELINE_LINE = "it learned: below the trivial baseline 10 (predicting the mean, validation rows)"


def result(losses, val_loss=None, first_bad=None, phase=None, skipped=()):
    history = StepHistory(0, 1)
    for number, loss in enumerate(losses):
        history.add(StepRecord(step=number, batch_rows=8, loss=loss, data_loss=loss, grad_global_norm=1.0,
                               applied_grad_global_norm=1.0, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                               loss_nonfinite=not math.isfinite(loss), grad_nonfinite=0, weights_nonfinite=0,
                               variables=[VariableStats(1.0, 0, 1.0, 1e-3, 0)], update_skipped=number in skipped,
                               loss_scale=1.0, loss_scale_before=2.0 if number in skipped else 1.0))
    return ExperimentResult(name="r", params={}, history=history, first_nonfinite_step=first_bad,
                            final_loss=losses[-1] if losses else None, best_loss=min(losses, default=None),
                            val_loss=val_loss, first_nonfinite_phase=phase)


def run(kind, losses, val_loss=None, threshold=1.0, source="given", clipped=None, check=None, **bad):
    strategy = Strategy(kind, None if kind == "none" else threshold, source)
    effect = StepEffect(clipped, 0.25 if clipped is not None else None, 0, 0)
    return StrategyRun(strategy, result(losses, val_loss, **bad), effect, check)


def verdict(runs, baseline=10.0, spec="s.yaml", interrupted=False):
    report = ClippingReport(run={"spec": spec, "optimizer": {"name": "adam"}}, runs=runs, thresholds={},
                            baseline=Baseline(baseline, "validation", "predicting the mean") if baseline else None,
                            interrupted=interrupted)
    decide(report)
    return report


def test_each_qualifying_strategy_says_why_with_its_numbers_and_only_the_best_is_called_lowest():
    check = OptimizerCheck(True, False, 0.0, 4.0, "first step: update equals the clipnorm=1 reference")
    runs = [run("none", [5.0, math.nan], first_bad=1, phase="backward"),
            run("clipnorm", [12.0, 4.0], val_loss=3.0, clipped=0.5, check=check),
            run("manual_clip_by_global_norm", [12.0, 3.0, 4.0], val_loss=3.5, threshold=2.5,
                source="p90 of the unclipped norms")]
    best, second = verdict(runs).recommendations
    assert best["why"] == [
        "stayed finite for all 2 steps; validation loss 3 (lowest of the strategies that stayed finite)",
        BASELINE_LINE,
        "without clipping the run went non-finite at step 1",
        "threshold 1: given",
        "clipping was active on 50% of the steps, removing on average 25% of the gradient norm where it was",
        "first step: update equals the clipnorm=1 reference"]
    assert second["why"] == [
        "stayed finite for all 3 steps; validation loss 3.5", BASELINE_LINE,
        "without clipping the run went non-finite at step 1", "threshold 2.5: p90 of the unclipped norms"]
    assert (second["name"], second["metric"], second["value"]) == ("manual_clip_by_global_norm=2.5",
                                                                  "validation loss", 3.5)
    assert second["code"] == "grads, _ = tf.clip_by_global_norm(grads, 2.5)\n" \
                             "optimizer.apply_gradients(zip(grads, model.trainable_variables))"


def test_an_unclipped_run_that_learns_says_clipping_is_not_needed_and_without_a_baseline_no_baseline_line():
    (rec,) = verdict([run("none", [5.0, 2.0])], baseline=None).recommendations
    assert rec["why"] == ["stayed finite for all 2 steps; training loss 2 (lowest of the strategies that stayed "
                          "finite)", "the unclipped run stays finite: clipping is not needed here"]
    assert rec["code"] is None


def test_a_finite_unclipped_run_is_not_cited_as_going_non_finite():
    recs = verdict([run("none", [12.0, 11.0], val_loss=11.0), run("clipvalue", [12.0, 2.0], val_loss=2.0)])
    assert recs.recommendations[0]["why"] == [
        "stayed finite for all 2 steps; validation loss 2 (lowest of the strategies that stayed finite)",
        BASELINE_LINE, "threshold 1: given"]


def test_skipped_updates_are_counted_and_the_clipped_share_is_of_the_applied_steps():
    losses = [12.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0]
    (rec,) = verdict([run("clipnorm", losses, val_loss=3.0, clipped=0.125, skipped=(2, 5))]).recommendations
    assert rec["why"][1:] == [
        "the LossScaleOptimizer skipped 2 of its updates (scaled gradients overflowed float16 and its scale was "
        "halved): loss scaling at work, not failures",
        BASELINE_LINE, "threshold 1: given",
        "clipping was active on 12% of the steps whose update was applied, removing on average 25% of the "
        "gradient norm where it was"]


def test_finite_strategies_that_did_not_learn_are_counted_and_the_best_is_named():
    two = verdict([run("clipnorm", [12.0, 11.0], val_loss=11.0), run("clipvalue", [12.0, 10.5], val_loss=10.5),
                   run("auto", [12.0, math.nan], first_bad=1, phase="update")], spec=None)
    assert two.hides_problem is True and two.recommended is None and two.recommendations == []
    assert two.diagnosis == (
        "2 strategies stayed finite, but none learned: the best, clipvalue=1, ended with validation loss 10.5, no "
        "better than the trivial baseline 10 (predicting the mean). Clipping only hides the problem here: it keeps "
        "the weights finite while the model learns nothing. Run `nanscope trace-steps SPEC` for the diagnosis "
        "(e.g. scale the targets or the inputs, lower the learning rate, repair bad rows).")
    one = verdict([run("clipnorm", [12.0, 11.0])])
    assert one.diagnosis.startswith("1 strategy stayed finite, but none learned: the best, clipnorm=1, ended with "
                                    "training loss 11, no better than the trivial baseline 10 (predicting the mean).")


def test_an_interrupted_comparison_counts_the_strategies_that_ran_a_step():
    ran = run("none", [5.0, math.nan], first_bad=1, phase="backward")
    assert verdict([ran], interrupted=True).diagnosis == (
        "interrupted before a strategy could be recommended: 1 strategy ran, none finished finite; no verdict on "
        "the others")
    never = StrategyRun(Strategy("clipnorm", 1.0), result([]), StepEffect(None, None, 0, 0))
    assert verdict([ran, ran, never], interrupted=True).diagnosis.startswith(
        "interrupted before a strategy could be recommended: 2 strategies ran,")


def test_nothing_helps_before_the_gradient_names_the_unclipped_runs_step_and_phase():
    runs = [run("clipnorm", [5.0, 5.0, math.nan], first_bad=2, phase="loss"),
            run("none", [5.0, 5.0, 5.0, math.nan], first_bad=3, phase="forward")]
    assert verdict(runs).diagnosis == (
        "every strategy went non-finite; without clipping the first non-finite value appears at step 3 in the "
        "forward phase, before any gradient exists, so clipping cannot prevent it (e.g. a log of zero, a division "
        "by zero, bad data). Run `nanscope trace-steps s.yaml` for the layer and the fix.")


def test_without_an_unclipped_run_the_first_strategy_speaks_for_the_comparison():
    runs = [run("clipnorm", [5.0, math.nan], first_bad=1, phase="data"),
            run("clipvalue", [5.0, 5.0, math.nan], first_bad=2, phase="backward")]
    assert "appears at step 1 in the data phase, before any gradient exists" in verdict(runs).diagnosis


def test_nothing_helps_after_the_gradient_says_bounding_it_is_not_enough():
    runs = [run("none", [5.0, math.nan], first_bad=1, phase="backward"),
            run("clipnorm", [5.0, math.nan], first_bad=1, phase="update")]
    assert verdict(runs).diagnosis == (
        "every strategy went non-finite, clipped or not: bounding the gradient is not enough here. "
        f"{TRACE} (e.g. lower the learning rate, scale the targets).")


def test_no_run_or_an_unclipped_run_without_a_step_says_no_strategy_ran():
    assert verdict([]).diagnosis == "no strategy ran a step"
    empty = StrategyRun(Strategy("none"), result([]), StepEffect(None, None, 0, 0))
    assert verdict([empty, run("clipnorm", [5.0, math.nan], first_bad=1, phase="backward")]).diagnosis == \
        "no strategy ran a step"


def test_without_a_baseline_a_finite_strategy_that_learned_nothing_had_its_updates_skipped():
    stalled = verdict([run("clipnorm", [12.0, 11.0, 11.0], skipped=(0, 1, 2))], baseline=None)
    assert stalled.hides_problem is True
    assert stalled.diagnosis == (
        "1 strategy stayed finite, but none learned: the best, clipnorm=1, ended with training loss 11, its updates "
        "skipped by loss scaling, so no weight changed. Clipping only hides the problem here: it keeps the weights "
        "finite while the model learns nothing. Run `nanscope trace-steps s.yaml` for the diagnosis (e.g. scale the "
        "targets or the inputs, lower the learning rate, repair bad rows).")
