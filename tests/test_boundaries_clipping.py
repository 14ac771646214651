"""The clip threshold: its percentile, its learning-rate bound, its rounding, and each mode's share of it.

compare-clipping derives one global-norm bound G from the unclipped run's healthy steps
(the 10th percentile of their global gradient norms, lowered so that one step moves the
weights by at most 1% of their norm) and gives each mode the bound that caps the global
norm at G: G itself, G / sqrt(variables) per variable, G / sqrt(parameters) per element.
"""

import math

import numpy as np
import pytest

from nanscope.run.clipping.strategies import Strategy
from nanscope.run.clipping.thresholds import derive_thresholds
from nanscope.engine.records import StepRecord, VariableStats
from nanscope.run.experiment import ExperimentResult
from nanscope.store.history import StepHistory
from nanscope.rules.diagnose import clip_threshold, round_threshold


@pytest.mark.parametrize("value, rounded", [
    (0.0347, 0.03), (0.0351, 0.04), (1.9, 2.0), (123.0, 100.0), (7.0, 7.0), (0.95, 0.9), (0.96, 1.0),
    (0.0, 1.0), (-3.0, 1.0), (math.inf, 1.0), (math.nan, 1.0),
])
def test_a_threshold_is_rounded_to_one_significant_digit(value, rounded):
    assert round_threshold(value) == rounded


def test_the_threshold_is_the_10th_percentile_of_the_healthy_norms():
    norms = [float(n) for n in range(1, 11)]  # numpy's 10th percentile of 1..10 is 1.9
    assert clip_threshold(norms, None, 0.0) == (2.0, "the 10th percentile of the healthy steps' gradient norms")
    assert clip_threshold([*norms, math.inf, math.nan], None, 0.0)[0] == 2.0  # non-finite norms are left out
    assert clip_threshold([], None, 0.0)[0] == 1.0


@pytest.mark.parametrize("weight_norm, threshold", [
    pytest.param(18.0, 0.2, id="bound-below-the-percentile"),  # 1% x 18 / 1.0 = 0.18 < 0.19
    pytest.param(19.0, 0.2, id="bound-at-the-percentile"),  # 0.19: the percentile, rounded the same
    pytest.param(30.0, 0.2, id="bound-above-the-percentile"),
])
def test_the_learning_rate_bound_lowers_the_threshold_only_below_the_percentile(weight_norm, threshold):
    norms = [0.1 * n for n in range(1, 11)]  # 10th percentile 0.19
    value, how = clip_threshold(norms, 1.0, weight_norm)
    assert value == threshold
    assert how.startswith("so that one step") == (weight_norm < 19.0)


def test_the_learning_rate_bound_is_one_percent_of_the_weight_norm_per_learning_rate():
    value, how = clip_threshold([100.0] * 5, 0.5, 20.0)  # 0.01 x 20 / 0.5 = 0.4, below the percentile 100
    assert value == 0.4
    assert how == ("so that one step of learning rate 0.5 moves the weights (norm 20) by at most 1%; the 10th "
                   "percentile of healthy norms, 100, would allow larger steps")
    assert clip_threshold([100.0] * 5, 0.0, 20.0)[0] == 100.0  # no learning rate: no bound
    assert clip_threshold([100.0] * 5, 0.5, 0.0)[0] == 100.0  # no weight norm known: no bound


def unclipped_run(norms, variables=4):
    history = StepHistory(0, variables)
    for number, norm in enumerate(norms):
        history.add(StepRecord(step=number, batch_rows=8, loss=1.0, data_loss=1.0, grad_global_norm=norm,
                               applied_grad_global_norm=norm, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                               loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0,
                               variables=[VariableStats(norm / 2, 0, 5.0, 1e-3, 0) for _ in range(variables)]))
    return ExperimentResult(name="none", params={}, history=history, first_nonfinite_step=None, final_loss=1.0,
                            best_loss=1.0, val_loss=None, first_healthy=history.kept()[0])


@pytest.mark.parametrize("variables, clipnorm", [(1, 8.0), (4, 4.0), (16, 2.0), (100, 0.8)])
def test_each_mode_caps_the_global_norm_at_the_same_bound(variables, clipnorm):
    strategies = [Strategy(kind) for kind in ("none", "global_clipnorm", "manual_clip_by_global_norm", "clipnorm",
                                              "manual_clip_by_norm", "clipvalue", "auto")]
    strategies.append(Strategy("clipnorm", threshold=3.0))  # a given threshold stays
    # Norms 4 .. 40: the 10th percentile is 7.6, the bound G rounds it to 8 (no learning rate: no lower bound).
    found = derive_thresholds(strategies, unclipped_run([4.0 * n for n in range(1, 11)], variables), None, 10_000)
    assert found == {"global_norm_bound": 8.0, "how": "the 10th percentile of the healthy steps' gradient norms",
                     "healthy_steps": 10, "auto_from": "percentile", "auto_min_healthy_steps": 10}
    thresholds = {s.kind: s.threshold for s in strategies[:-1]}
    assert thresholds == {"none": None, "global_clipnorm": 8.0, "manual_clip_by_global_norm": 8.0,
                          # G / sqrt(variables): clipped each to it, the variables together have norm G.
                          "clipnorm": clipnorm, "manual_clip_by_norm": clipnorm,
                          "clipvalue": 0.08,  # G / sqrt(10,000 parameters)
                          "auto": 8.0}
    assert strategies[-1].threshold == 3.0 and strategies[-1].threshold_source == "given"
    assert strategies[3].threshold_source == (f"G / sqrt({variables} variables), so all variables clipped together "
                                              "stay within G = 8")


def test_the_learning_rate_bound_uses_the_first_healthy_weight_norm():
    # 4 variables of norm 5: the weights' norm is 10; lr 1: 1% x 10 / 1 = 0.1 < the percentile 7.6.
    strategies = [Strategy("global_clipnorm"), Strategy("auto")]
    derive_thresholds(strategies, unclipped_run([4.0 * n for n in range(1, 11)]), 1.0, 10)
    assert [s.threshold for s in strategies] == [0.1, 8.0]  # AutoClip takes no learning-rate bound
    derive_thresholds(strategies := [Strategy("global_clipnorm")], unclipped_run([4.0] * 3), 1.0, 10,
                      weight_norm=1000.0)
    assert strategies[0].threshold == 4.0  # 1% x 1000 / 1 = 10 > the percentile 4


@pytest.mark.parametrize("healthy, auto, source", [(9, 0.1, "global_norm_bound"), (10, 8.0, "percentile")])
def test_auto_needs_10_healthy_steps_for_its_percentile_else_takes_the_bound(healthy, auto, source):
    # 4 variables of norm 5: the weights' norm is 10; lr 1: G = 1% x 10 / 1 = 0.1, below the percentile.
    strategies = [Strategy("auto")]
    found = derive_thresholds(strategies, unclipped_run([4.0 * n for n in range(1, healthy + 1)]), 1.0, 10)
    assert (strategies[0].threshold, found["auto_from"]) == (auto, source)


def test_an_unclipped_run_without_a_healthy_step_falls_back_to_1():
    strategies = [Strategy("clipnorm"), Strategy("clipvalue")]
    found = derive_thresholds(strategies, unclipped_run([math.nan] * 3), 0.1, 100)
    assert found["global_norm_bound"] == 1.0 and found["healthy_steps"] == 0
    assert [s.threshold for s in strategies] == [round_threshold(1 / math.sqrt(4)), 0.1]
    assert np.isclose(strategies[0].threshold, 0.5)
