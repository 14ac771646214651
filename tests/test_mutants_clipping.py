"""compare-clipping's thresholds and fix snippets where the boundary tables leave a choice open, each pinned by an
exact value: the fallback's words and label, a run without a step, a model of one parameter, the optimizer class and
arguments a snippet carries, loss scaling as the run says it, and a strategy whose validation loss is not finite.

Minimal histories, no training (docs/mutation.md lists what each test here was written to catch)."""

import math

from nanscope.run.clipping.baseline import Baseline
from nanscope.run.clipping.compare import ClippingReport
from nanscope.run.clipping.strategies import Strategy
from nanscope.run.clipping.thresholds import derive_thresholds
from nanscope.run.clipping.verdict import decide, fix_snippets
from nanscope.run.experiment import ExperimentResult
from nanscope.store.history import StepHistory
from test_boundaries_clipping import unclipped_run
from test_mutants_verdict import run

FALLBACK = "the unclipped run had no healthy step to measure; fell back to 1"


def sources(strategies):
    return {s.kind: (s.threshold, s.threshold_source) for s in strategies}


def test_a_run_without_a_healthy_step_falls_back_to_1_and_says_so_for_every_mode():
    strategies = [Strategy(kind) for kind in ("global_clipnorm", "clipnorm", "clipvalue", "auto")]
    found = derive_thresholds(strategies, unclipped_run([math.nan] * 3, variables=4), 0.1, 1)
    assert found == {"global_norm_bound": 1.0, "how": FALLBACK, "healthy_steps": 0, "auto_from": "fallback",
                     "auto_min_healthy_steps": 10}
    assert sources(strategies) == {
        "global_clipnorm": (1.0, f"G = 1: {FALLBACK}"),
        "clipnorm": (0.5, "G / sqrt(4 variables), so all variables clipped together stay within G = 1"),
        # One parameter: G itself (a model of one weight has no smaller share to give it).
        "clipvalue": (1.0, "G / sqrt(1 parameters), so a gradient at the bound in every element has norm G = 1"),
        "auto": (1.0, FALLBACK),
    }


def test_a_run_that_ran_no_step_shares_the_bound_as_one_variable():
    empty = ExperimentResult(name="none", params={}, history=StepHistory(0, 4), first_nonfinite_step=None,
                             final_loss=None, best_loss=None, val_loss=None, first_healthy=None)
    strategies = [Strategy("clipnorm")]
    derive_thresholds(strategies, empty, 0.1, 100)
    assert sources(strategies) == {
        "clipnorm": (1.0, "G / sqrt(1 variables), so all variables clipped together stay within G = 1")}


OPTIMIZER = {"name": "AdamW", "learning_rate": 0.01, "clipnorm": 5.0, "global_clipnorm": None, "clipvalue": 2.0,
             "weight_decay": 0.004}


def test_a_keras_option_snippet_keeps_the_optimizers_class_and_arguments_but_no_other_clipping():
    for kind in ("clipnorm", "global_clipnorm", "clipvalue"):
        assert fix_snippets(Strategy(kind, 0.5, "given"), OPTIMIZER) == (
            f"train:\n  optimizer: {{{kind}: 0.5}}",
            f"optimizer = keras.optimizers.AdamW(learning_rate=0.01, weight_decay=0.004, {kind}=0.5)")
    clipnorm = Strategy("clipnorm", 0.5, "given")
    assert fix_snippets(clipnorm, {"name": "RMSprop"})[1] == "optimizer = keras.optimizers.RMSprop(clipnorm=0.5)"
    assert fix_snippets(clipnorm, {"learning_rate": 0.01})[1] == (
        "optimizer = keras.optimizers.SGD(learning_rate=0.01, clipnorm=0.5)")  # a spec's optimizer defaults to sgd
    assert fix_snippets(clipnorm, None)[1] == "optimizer = keras.optimizers.SGD(clipnorm=0.5)"
    assert fix_snippets(clipnorm, {"name": "adam"}) == fix_snippets(clipnorm, {"name": "adam"}, loss_scaling=False)


def test_the_recommendation_carries_the_runs_optimizer_and_loss_scaling_and_ranks_a_nan_validation_loss_last():
    runs = [run("none", [5.0, math.nan], first_bad=1, phase="backward"),
            run("clipnorm", [4.0, 3.0], val_loss=math.nan),  # no baseline to beat: it qualifies, but ranks last
            run("global_clipnorm", [4.0, 3.0], val_loss=2.0)]
    report = ClippingReport(run={"optimizer": {"name": "adamw", "learning_rate": 0.1}, "loss_scaling": True},
                            runs=runs, thresholds={}, baseline=None)
    decide(report)
    assert report.recommended == "global_clipnorm=1"
    best = report.recommendations[0]
    assert (best["yaml"], best["code"]) == (
        "train:\n  optimizer: {global_clipnorm: 1}",
        "optimizer = keras.optimizers.AdamW(learning_rate=0.1, global_clipnorm=1)\n"
        "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # unscales, then the inner one clips")
    assert [r["name"] for r in report.recommendations] == ["global_clipnorm=1", "clipnorm=1"]


def test_a_strategy_that_ran_one_finite_step_qualifies():
    report = ClippingReport(run={}, runs=[run("clipnorm", [4.0])], thresholds={}, baseline=None)
    decide(report)
    assert report.recommended == "clipnorm=1"
    assert report.recommendations[0]["why"] == [
        "stayed finite for all 1 steps; training loss 4 (lowest of the strategies that stayed finite)",
        "threshold 1: given"]
    assert report.recommendations[0]["code"] == "optimizer = keras.optimizers.SGD(clipnorm=1)"


def test_a_report_without_a_spec_path_names_the_spec_as_SPEC():
    before = ClippingReport(run={}, runs=[run("none", [5.0, math.nan], first_bad=1, phase="forward"),
                                          run("clipnorm", [4.0, math.nan], first_bad=1, phase="forward")],
                            thresholds={}, baseline=None)
    decide(before)
    assert before.diagnosis.endswith("Run `nanscope trace-steps SPEC` for the layer and the fix.")


def test_clipping_that_only_hides_the_problem_names_the_runs_spec():
    report = ClippingReport(run={"spec": "s.yaml"}, runs=[run("none", [5.0]), run("clipnorm", [4.0])], thresholds={},
                            baseline=Baseline(1.0, "validation", "predicting the mean"))
    decide(report)
    assert report.diagnosis == (
        "2 strategies stayed finite, but none learned: the best, clipnorm=1, ended with training loss 4, no better "
        "than the trivial baseline 1 (predicting the mean). Clipping only hides the problem here: it keeps the "
        "weights finite while the model learns nothing. Run `nanscope trace-steps s.yaml` for the diagnosis (e.g. "
        "scale the targets or the inputs, lower the learning rate, repair bad rows).")


def test_a_compiled_models_optimizer_gets_a_snippet_not_a_crash():
    # compare-clipping's run description says "from the compiled model" where the spec names no optimizer (the
    # factory compiled one): the snippet then has no arguments to carry over. It raised AttributeError before.
    report = ClippingReport(run={"optimizer": "from the compiled model"}, runs=[run("clipnorm", [4.0])],
                            thresholds={}, baseline=None)
    decide(report)
    assert (report.recommendations[0]["yaml"], report.recommendations[0]["code"]) == (
        "train:\n  optimizer: {clipnorm: 1}", "optimizer = keras.optimizers.SGD(clipnorm=1)")


def test_a_snippet_drops_every_clipping_argument_of_the_spec_and_knows_rmsprop_by_its_lower_case_name():
    spec_optimizer = {"name": "rmsprop", "global_clipnorm": 3.0, "clipnorm": 2.0, "clipvalue": 1.0, "rho": 0.8}
    assert fix_snippets(Strategy("clipvalue", 0.5, "given"), spec_optimizer)[1] == (
        "optimizer = keras.optimizers.RMSprop(rho=0.8, clipvalue=0.5)")
