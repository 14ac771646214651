"""Decisions the boundary tables left open, each pinned by an exact value: the optimizer-epsilon rule's words and
its float16 bound, exp's far-past bound, the falling-loss test of lower-learning-rate, which rules `--verify` can
apply, the ranking of verified fixes, and the attribution of a bad step to an output, a layer and a loss scale.

Minimal histories and records, no training (docs/mutation.md lists what each test here was written to catch)."""

import math
from dataclasses import replace
import re
from types import SimpleNamespace

import keras
import numpy as np
import pytest

from boundary_runs import LAYERS, fired, first_at, report_of, step, up
from nanscope.run.attribution import StepNames, attribute_from_record, bad_values_line, describe_bad_batch
from nanscope.engine.records import LayerStats, OutputStats, StepRecord, VariableStats
from nanscope.report.model import TraceReport
from nanscope.rules.catalogue import RULES, recommend
from nanscope.rules import (bounded_activation, clean_input_data, clip_gradients, guard_op, learning_rate, precision,
                            producer, registry, scale, weight_constraint)
from nanscope.rules.facts import Facts, HealthySteps, LayerFacts, facts_from
from nanscope.store.history import StepHistory
from nanscope.rules.diagnose import calibrated, diagnose
from nanscope.rules.rule import Recommendation
from nanscope.rules.evidence import FeatureScale, RunEvidence, TargetScale
from nanscope.rules.learning_rate import loss_falling
from nanscope.rules.registry import verify_fixers
from nanscope.run.verify import ranked_by_verification

UPDATE_BAD = [step(0, weights_nonfinite=1)]


def epsilon_rule(epsilon=1e-7, first=None, records=UPDATE_BAD, config=True):
    report = report_of(records, first or first_at(0, "update", op="Sqrt", source=None,
                                                   inputs={"min": 0.0, "max": 1.0}))
    if config:
        report.run["optimizer_config"]["epsilon"] = epsilon
    else:
        del report.run["optimizer_config"]
    return fired(report, RunEvidence()).get("optimizer-epsilon")


@pytest.mark.parametrize("epsilon, line", [
    (6e-8, "optimizer epsilon 6e-08"),  # float16's smallest subnormal is 6e-8: at it, epsilon survives the cast
    (math.nextafter(6e-8, 0), "optimizer epsilon 6e-08 underflows to 0 in float16"),
    (1e-7, "optimizer epsilon 1e-07"),
])
def test_optimizer_epsilon_says_an_epsilon_below_6e_8_underflows_in_float16(epsilon, line):
    rec = epsilon_rule(epsilon)
    assert rec.evidence == ["step 0, update pass: the gradients were finite but the update was not (Sqrt fed input "
                            "min 0, max 1, 0.0% zeros, 0.0% negative)", line]
    assert rec.data == {"step": 0, "op": "Sqrt", "epsilon": epsilon}


def test_optimizer_epsilon_without_an_op_or_an_optimizer_config_says_only_what_it_knows():
    assert epsilon_rule(first=first_at(0, "update")).evidence == [
        "step 0, update pass: the gradients were finite but the update was not", "optimizer epsilon 1e-07"]
    bare = epsilon_rule(first=first_at(0, "update", op="Sqrt", inputs={}), config=False)
    assert bare.evidence == ["step 0, update pass: the gradients were finite but the update was not"]
    assert bare.data["epsilon"] is None


def test_optimizer_epsilon_looks_for_bad_gradients_at_the_failing_step_only():
    earlier_bad_grad = [step(0, grad_nonfinite=1), step(1, weights_nonfinite=1)]
    assert epsilon_rule(records=earlier_bad_grad, first=first_at(1, "update")) is not None
    bad_grad_there = [step(0), step(1, grad_nonfinite=1, weights_nonfinite=1)]
    assert epsilon_rule(records=bad_grad_there, first=first_at(1, "update")) is None


def exp_rule(**inputs):
    first = first_at(0, "forward", layer="hidden", op="Exp", source=None, inputs=inputs)
    return fired(report_of([step(0, loss=math.inf, loss_nonfinite=True)], first), RunEvidence())["stable-exp"]


def test_stable_exp_sends_an_operand_past_twice_the_bound_to_normalize_inputs():
    bound = math.log(float(np.finfo("float32").max))  # 88.72
    assert len(exp_rule(dtype="float32", max=2 * bound).evidence) == 1
    far = exp_rule(dtype="float32", max=math.nextafter(2 * bound, math.inf)).evidence
    assert far[1] == ("its operand reaches 177.4, 2x the bound: a clamp there saturates every value; bring the "
                      "inputs to unit scale first (normalize-inputs)")


def test_stable_exp_without_a_measured_dtype_speaks_of_float32():
    rec = exp_rule(max=100.0)
    assert rec.evidence == ["step 0, forward pass, layer hidden: Exp fed input min nan, max 100, 0.0% zeros, "
                            "0.0% negative; exp overflows float32 past 88.72 (log of the dtype's max)"]
    assert rec.fix.endswith("# a clamp last: tf.exp(tf.minimum(x, 80.0))  # float32: log(max) = 88.72; less log(n) "
                            "for a sum of n exps")


@pytest.mark.parametrize("losses, falling", [
    pytest.param([1.0, 1.0, 1.0, 1.0, 0.98, 0.98], False, id="last-third-at-0.98-of-the-first"),
    pytest.param([1.0, 1.0, 1.0, 1.0, math.nextafter(0.98, 0), math.nextafter(0.98, 0)], True,
                 id="just-below-0.98"),
    pytest.param([1.0, 2.0, 1.0, 1.0, 0.5, 1.6], True, id="thirds-of-two-steps-not-one"),
    pytest.param([4.0, 3.0, 2.0, 1.0, 0.5], False, id="five-steps-are-too-few"),
    pytest.param([4.0, 3.0, math.nan, 2.0, 1.0, 0.5], False, id="a-nan-step-does-not-count"),
    pytest.param([4.0, 3.0, 2.5, 2.0, 1.0, 0.5], True, id="six-finite-steps"),
])
def test_the_loss_is_falling_when_its_last_third_averages_below_0_98_of_its_first(losses, falling):
    assert loss_falling(SimpleNamespace(loss=np.array(losses))) is falling


def test_verify_can_apply_the_fix_of_every_rule_with_a_verify_fixes_except_float32_layer():
    # float32-layer shares rules/precision.py's verify_fixes with loss-scaling, which is the one --verify tries.
    fixers = verify_fixers()
    assert sorted(fixers) == ["bounded-activation", "clip-gradients", "drop-outlier-rows", "loss-scaling",
                              "lower-learning-rate", "normalize-inputs", "normalize-targets", "optimizer-epsilon"]
    assert all(callable(fix) for fix in fixers.values())


def test_verified_fixes_rank_by_their_best_loss_relative_to_the_baseline_lowest_first():
    recs = [recommend(rule, "error", []) for rule in ("stable-log", "clip-gradients", "lower-learning-rate")]
    for rec, relative in zip(recs, (0.5, 0.2, 0.9)):
        rec.verified = True
        rec.verification = [{"helped": True, "relative_loss": relative}, {"helped": False, "relative_loss": 0.01}]
    assert [r.id for r in ranked_by_verification(recs)] == ["clip-gradients", "stable-log", "lower-learning-rate"]


def bad_record(**fields):
    values = {"step": 3, "batch_rows": 8, "loss": 1.0, "data_loss": 1.0, "grad_global_norm": 1.0,
              "applied_grad_global_norm": 1.0, "x_nonfinite": 0, "y_nonfinite": 0, "output_nonfinite": 0,
              "loss_nonfinite": False, "grad_nonfinite": 0, "weights_nonfinite": 0, **fields}
    return StepRecord(**values)


def test_an_output_past_the_named_ones_is_not_named():
    record = bad_record(outputs=[OutputStats(1.0, 0, 0), OutputStats(math.inf, 0, 0)], loss=math.inf,
                        loss_nonfinite=True)
    assert attribute_from_record(record, StepNames(outputs=["price", "kind"])).output == "kind"
    assert attribute_from_record(record, StepNames(outputs=["price"])).output is None


def test_a_nested_variable_names_its_whole_layer_path():
    variables = [VariableStats(math.nan, 1, 1.0, 1e-3, 0)]
    record = bad_record(grad_global_norm=math.nan, grad_nonfinite=1, variables=variables)
    first = attribute_from_record(record, StepNames(variables=["encoder/block_1/dense/kernel"]))
    assert (first.variable, first.layer) == ("encoder/block_1/dense/kernel", "encoder/block_1/dense")


@pytest.mark.parametrize("before, said", [(1024.0, "1024"), (None, "0")])
def test_a_skipped_backward_step_names_the_scale_it_was_skipped_at(before, said):
    variables = [VariableStats(math.nan, 1, 1.0, 1e-3, 0)]
    record = bad_record(grad_global_norm=math.nan, grad_nonfinite=1, variables=variables, update_skipped=True,
                        loss_scale=512.0, loss_scale_before=before, scale_collapsed=True)
    first = attribute_from_record(record, StepNames(variables=["dense/kernel"]))
    assert first.phase == "backward"
    assert first.detail == [
        "1 of 1 variables affected",
        f"the LossScaleOptimizer skipped this update with its scale at {said}, as it skipped most of the updates "
        "before it: the gradients are not finite at any scale it tried, and no weight is changing"]


def test_an_expected_layer_index_past_the_probed_layers_does_not_excuse_a_bad_output():
    layers = [LayerStats(1.0, 0.5, 0, 0.0, 0.0) for _ in LAYERS]
    record = bad_record(output_nonfinite=1, layers=layers, expected_nonfinite=[len(layers)])
    assert record.phase == "forward"


def test_where_names_the_step_phase_layer_loss_output_function_node_and_source():
    from nanscope.rules.operand import where

    first = first_at(4, "backward", layer="head", layer_class="Dense", loss="the loss", output="price",
                     source="model.py:7", context={"function": {"node": "mul_2", "call": "focal"}})
    assert where(first) == ("step 4, backward pass, layer head (Dense), the loss, output 'price', node mul_2 inside "
                            "the function call focal, model.py:7")
    assert where(first_at(4, "loss", loss="kind_loss")) == "step 4, loss pass, loss kind_loss"
    assert where(first_at(0, "forward", context={"masked_rows": 1})) == "step 0, forward pass"


def test_operand_cites_the_named_operand_or_input_and_nan_where_nothing_was_measured():
    from nanscope.rules.operand import listed, operand, source_fix

    assert operand({}) == "input min nan, max nan, 0.0% zeros, 0.0% negative"
    assert operand({"operand": "y", "min": -2.0, "max": 3.5, "zero_fraction": 0.125, "negative_fraction": 0.5}) == \
        "y min -2, max 3.5, 12.5% zeros, 50.0% negative"
    assert listed(list(range(8))) == "0, 1, 2, 3, 4, 5, 6, 7"
    assert listed(list(range(9))) == "0, 1, 2, 3, 4, 5, 6, 7 ..."
    assert source_fix(first_at(0, "forward"), "y = f(x)") == "y = f(x)"


@pytest.mark.parametrize("op, nonfinite, fires", [("Softmax", 1, True), ("LogSoftmax", 2, True),
                                                   ("Softmax", 0, False), ("Exp", 3, False)])
def test_finite_logits_needs_a_softmax_fed_at_least_one_non_finite_logit(op, nonfinite, fires):
    from nanscope.rules.finite_logits import matches

    inputs = {"op": op, "nonfinite": nonfinite} if nonfinite else {"op": op}
    assert matches(first_at(0, "forward", op=op), inputs, op) is fires


def guard(phase, op="Prod", **inputs):
    first = first_at(0, phase, layer="hidden", op=op, source=None,
                     inputs={"op": op, "min": 2.0, "max": 1e30, **inputs} if op else {})
    records = [step(0, weights_nonfinite=1)] if phase == "update" else [step(0, loss=math.inf, loss_nonfinite=True)]
    return fired(report_of(records, first), RunEvidence()).get("guard-op")


def test_guard_op_speaks_for_a_forward_or_backward_producer_only():
    assert guard("forward") is not None and guard("loss") is not None
    assert guard("data") is None and guard("update") is None and guard("forward", op=None) is None


def test_guard_op_cites_the_gradient_and_its_domain_in_the_backward_pass():
    rec = guard("backward", op="Tan")
    assert rec.evidence == ["step 0, backward pass, layer hidden: Tan (gradient of Tan) fed input min 2, max 1e+30, "
                            "0.0% zeros, 0.0% negative; inside its domain as measured (the same): the result "
                            "overflowed"]
    assert rec.fix == "tf.tan(tf.clip_by_value(x, -1.57, 1.57))"
    assert rec.data == {"step": 0, "op": "Tan", "layer": "hidden", "source": None, "min": 2.0, "max": 1e30}
    outside = guard("forward", op="Acosh", min=0.5, max=2.0)
    assert outside.evidence[0].endswith("; outside Acosh's domain x >= 1")


def test_optimizer_epsilon_without_step_rows_has_no_bad_gradient_to_blame():
    # A report whose history holds no step (nothing to look a bad gradient up in) still gets the epsilon finding.
    assert epsilon_rule(records=[], first=first_at(0, "update")).evidence == [
        "step 0, update pass: the gradients were finite but the update was not", "optimizer epsilon 1e-07"]


# The bad batch's words (run/attribution.py): which columns and which rows of each float array hold NaN/Inf.
BATCH_ROWS = np.array([10, 11, 12, 13])


def bad_batch():
    x = np.zeros((4, 3))
    x[1, 2], x[3, 0] = math.nan, math.inf
    y = np.zeros((4, 1))
    y[2, 0] = math.nan
    return x, y


def test_a_bad_batch_names_its_columns_by_name_where_known_and_its_dataset_rows():
    x, y = bad_batch()
    assert describe_bad_batch(x, y, BATCH_ROWS, ["a"], ["price"]) == [
        "x: 2 non-finite value(s) in feature(s) a, x[2]; dataset rows 11, 13",
        "y: 1 non-finite value(s) in target(s) price; dataset rows 12"]
    assert describe_bad_batch(x, (y, y), BATCH_ROWS) == [
        "x: 2 non-finite value(s) in feature(s) x[0], x[2]; dataset rows 11, 13",
        "y0: 1 non-finite value(s) in target(s) y0[0]; dataset rows 12",
        "y1: 1 non-finite value(s) in target(s) y1[0]; dataset rows 12"]
    several = {"a": x, "ids": np.zeros((4, 2), np.int32)}  # integer inputs hold no NaN
    assert describe_bad_batch(several, (y, np.zeros((4, 1))), BATCH_ROWS, ["unused"], output_names=["p", "q"]) == [
        "x['a']: 2 non-finite value(s) in feature(s) x['a'][0], x['a'][2]; dataset rows 11, 13",
        "p: 1 non-finite value(s) in target(s) p[0]; dataset rows 12"]


def test_a_bad_values_line_shows_8_columns_and_rows_then_an_ellipsis():
    shown = ", ".join(f"w[{i}]" for i in range(8))
    assert bad_values_line("w", np.full((8, 8), math.nan), np.arange(8), rows_are="batch rows") == (
        f"w: 64 non-finite value(s) in value(s) {shown}; batch rows 0, 1, 2, 3, 4, 5, 6, 7")
    assert bad_values_line("w", np.full((9, 9), math.nan), np.arange(9), rows_are="batch rows") == (
        f"w: 81 non-finite value(s) in value(s) {shown} ...; batch rows 0, 1, 2, 3, 4, 5, 6, 7 ...")
    assert bad_values_line("w", np.full((2, 2, 2), math.nan), np.arange(2)) == (
        "w: 8 non-finite value(s) in value(s) w[0], w[1], w[2], w[3]; dataset rows 0, 1")  # flat after the rows


def test_a_bad_values_line_is_none_for_finite_integer_or_scalar_arrays():
    assert bad_values_line("x", np.zeros((3, 2)), np.arange(3)) is None
    assert bad_values_line("x", np.array(math.nan), np.arange(1)) is None
    assert bad_values_line("x", np.array([[1]]), np.arange(1)) is None


def test_a_float32_array_is_read_and_a_string_array_passed_over():
    x = np.zeros((2, 2), np.float32)  # what a dataset of float32 features holds
    x[1, 0] = math.nan
    words = np.array([["a"], ["b"]])  # a string input (a vocabulary lookup's): no NaN can be in it
    assert bad_values_line("x", x, np.arange(2)) == "x: 1 non-finite value(s) in value(s) x[0]; dataset rows 1"
    assert bad_values_line("words", words, np.arange(2)) is None
    assert describe_bad_batch({"a": x, "words": words}, np.zeros((2, 1), np.float32), BATCH_ROWS[:2]) == [
        "x['a']: 1 non-finite value(s) in feature(s) x['a'][0]; dataset rows 11"]


def rec(rule_id, severity, evidence=("measured",)):
    return Recommendation(rule_id, rule_id, severity, list(evidence), "fix")


def test_a_trajectory_error_becomes_a_warning_secondary_to_the_first_error_that_names_the_producer():
    ordered = [rec("lower-learning-rate", "error"), rec("stable-exp", "error"), rec("safe-sqrt", "error"),
               rec("clip-gradients", "error"), rec("weight-constraint", "warning"), rec("bounded-activation", "info")]
    assert calibrated(ordered) is ordered
    assert [(r.id, r.severity) for r in ordered] == [
        ("lower-learning-rate", "warning"), ("stable-exp", "error"), ("safe-sqrt", "error"),
        ("clip-gradients", "warning"), ("weight-constraint", "warning"), ("bounded-activation", "info")]
    secondary = ("secondary, so a warning: stable-exp names what produced the first non-finite value; this fix acts "
                 "on the run's trajectory, not on that producer")
    assert ordered[0].evidence == ["measured", secondary] and ordered[0].data == {"secondary_to": "stable-exp"}
    assert ordered[3].evidence == ["measured", secondary] and ordered[3].data == {"secondary_to": "stable-exp"}
    assert ordered[4].evidence == ["measured"] and ordered[4].data == {}  # only errors are lowered
    assert ordered[1].evidence == ["measured"] and ordered[1].data == {}


def test_trajectory_errors_stay_errors_without_a_producers_error():
    ordered = [rec("clip-gradients", "error"), rec("stable-exp", "warning"), rec("lower-learning-rate", "error")]
    calibrated(ordered)
    assert [r.severity for r in ordered] == ["error", "warning", "error"]
    assert all(r.evidence == ["measured"] and r.data == {} for r in ordered)


def test_a_recommendation_carries_its_rules_title_and_page_and_the_fix_and_data_it_is_given():
    rule = RULES["stable-log"]
    given = recommend("stable-log", "warning", ("measured",), fix="tf.math.log1p(x)", data={"step": 3})
    assert (given.id, given.title, given.severity, given.evidence, given.fix, given.verified, given.data,
            given.verification, given.docs) == ("stable-log", rule.title, "warning", ["measured"], "tf.math.log1p(x)",
                                                None, {"step": 3}, [], "docs/rules/stable-log.md")
    assert isinstance(rule.title, str) and rule.title
    default = recommend("stable-log", "info", [])
    assert (default.fix, default.data, default.docs) == (rule.fix, {}, "docs/rules/stable-log.md")


def test_a_severity_outside_error_warning_info_is_refused_naming_the_value_received():
    message = "`severity` must be one of ('error', 'warning', 'info'). Received: severity='fatal'"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        recommend("stable-log", "fatal", ["measured"])


def test_facts_without_a_history_have_no_step_rows_and_empty_healthy_columns_of_int64_steps_and_float64_values():
    for facts in (Facts(run={}), facts_from(TraceReport(run=None, layers=[("hidden", "Dense")], layer_order=[],
                                                        variables=[]), RunEvidence())):
        healthy = facts.healthy
        assert len(healthy) == 0 and facts.steps is None and facts.run == {}
        assert healthy.steps.dtype == np.int64 and healthy.steps.shape == (0,)
        for column in (healthy.loss, healthy.grad_norm, healthy.update_ratio, healthy.weight_norm):
            assert column.dtype == np.float64 and column.shape == (0,)
    [layer] = facts.layers
    assert (layer.name, layer.cls, layer.dtype, layer.relu_like, layer.called_steps, layer.max_abs,
            layer.max_abs_healthy) == ("hidden", "Dense", "float32", False, 0, 0.0, None)


def test_facts_of_an_empty_history_have_no_step_rows():
    report = TraceReport(run={}, layers=[], layer_order=[], variables=[], history=StepHistory(1, 1))
    assert facts_from(report, RunEvidence()).steps is None


def relu_model():
    return keras.Sequential([
        keras.Input((2,)), keras.layers.Dense(2, activation="relu", name="hidden"), keras.layers.ReLU(name="cut"),
        keras.layers.LeakyReLU(name="leak"), keras.layers.Dense(2, activation="tanh", dtype="float16", name="half"),
        keras.layers.Dense(1, activation=keras.layers.LeakyReLU(), name="head")])


def test_layer_facts_read_dtype_and_relu_likeness_from_the_model_and_extremes_past_the_history_as_unseen():
    names = [("hidden", "Dense"), ("cut", "ReLU"), ("leak", "LeakyReLU"), ("half", "Dense"), ("head", "Dense"),
             ("ghost", "Dense")]
    history = StepHistory(2, 1)
    history.add(step(0, layer_max=(3.0, 5.0)))
    report = TraceReport(run={}, layers=names, layer_order=[n for n, _ in names], variables=["hidden/kernel"],
                         history=history)
    facts = facts_from(report, RunEvidence(keras_model=relu_model()))
    # A layer-object activation (LeakyReLU()) is relu-like by its class; a name the model lacks is float32.
    assert [(f.name, f.cls, f.dtype, f.relu_like, f.called_steps, f.max_abs) for f in facts.layers] == [
        ("hidden", "Dense", "float32", True, 1, 3.0), ("cut", "ReLU", "float32", True, 1, 5.0),
        ("leak", "LeakyReLU", "float32", True, 0, 0.0), ("half", "Dense", "float16", False, 0, 0.0),
        ("head", "Dense", "float32", True, 0, 0.0), ("ghost", "Dense", "float32", False, 0, 0.0)]
    assert facts.layers[0].trend_steps.tolist() == [0] and facts.layers[1].trend_values.tolist() == [5.0]
    assert facts.layers[2].trend_steps.tolist() == [] and facts.layers[2].max_abs_healthy is None
    assert facts.steps["step"].tolist() == [0] and facts.healthy.steps.tolist() == [0]


def test_layer_facts_without_a_history_keep_the_models_dtype_and_nothing_measured():
    report = TraceReport(run={}, layers=[("half", "Dense"), ("cut", "ReLU")], layer_order=[], variables=[])
    facts = facts_from(report, RunEvidence(keras_model=relu_model()))
    assert [(f.dtype, f.relu_like, f.called_steps, f.trend_steps.tolist()) for f in facts.layers] == [
        ("float16", False, 0, []), ("float32", True, 0, [])]


def weight_facts(norms, losses=None, failed=False):
    norms = np.array(norms, float)
    losses = np.ones(len(norms)) if losses is None else np.array(losses, float)
    healthy = HealthySteps(np.arange(len(norms)), losses, np.ones(len(norms)), np.ones(len(norms)), norms)
    return Facts(run={}, first=first_at(len(norms)) if failed else None, healthy=healthy)


def test_weight_constraint_fires_past_ten_times_the_first_norm_with_a_tail_that_never_falls():
    growing = [0.5, 0, 1, 2, 3, 4, 6, 6]  # 12 times the first; a zero second norm and a flat tail still count
    [(score, rec)] = weight_constraint.detect(weight_facts(growing))
    assert (score, rec.severity, rec.data) == (0.5, "warning", {"first": 0.5, "last": 6.0})
    assert rec.evidence == ["weight norm (all weights) grew from 0.5 to 6 over 8 steps and is still rising "
                            "(limit 10x)"]
    [(_, failed)] = weight_constraint.detect(weight_facts(growing, failed=True))
    assert failed.severity == "error"
    assert weight_constraint.detect(weight_facts([0, 1, 2, 3, 4, 5, 6, 7])) == []
    assert weight_constraint.detect(weight_facts([0.5, math.nan, 1, 2, 3, 4, 6, 6])) == []


def test_weight_constraint_with_a_loss_falling_without_bound_says_so_and_ranks_at_0_85():
    losses = [-1, -1, -1, -1, -1, -1, -2.5, -2.5]
    [(score, rec)] = weight_constraint.detect(weight_facts([0.5, 1, 2, 3, 4, 5, 6, 7], losses))
    assert (score, rec.data) == (0.85, {"first": 0.5, "last": 7.0, "unbounded_loss": True})
    assert rec.evidence[1] == ("the loss fell below 0 and keeps falling with them (mean -1, then -2.5 over the last "
                               "two quarters of the steps): it has no minimum the weights can reach, so bounding "
                               "them bounds it")


def test_an_unbounded_loss_compares_the_last_two_quarters_and_needs_every_loss_finite():
    assert weight_constraint.unbounded_loss(np.array([0, 0, 0, 0, -10, -1, -1, -2.5, -2.5])) == (-1.0, -2.5)
    assert weight_constraint.unbounded_loss(np.array([0, 0, 0, 0, -2, -2, -2, -2.0])) is None
    assert weight_constraint.unbounded_loss(np.array([-1, -1, -1, -1, -1, -1, -math.inf, -math.inf])) is None


def detector_of(*found, raises=None):
    def detect(facts):
        if raises is not None:
            raise raises
        return list(found)
    return SimpleNamespace(detect=detect)


def diagnosed_with(monkeypatch, detectors, fallbacks):
    """What `diagnose` returns and notes on a healthy 3-step run with `detectors` and `fallbacks` for the registry's:
    each a list of (rule ids, SimpleNamespace(detect=...))."""
    monkeypatch.setattr(registry, "DETECTORS", tuple((ids, unit, "detect") for ids, unit in detectors))
    monkeypatch.setattr(registry, "FALLBACKS", tuple((ids, unit, "detect") for ids, unit in fallbacks))
    report = report_of([step(k) for k in range(3)])
    found = diagnose(report, RunEvidence())
    return [(r.id, r.severity, r.evidence) for r in found], report.notes


FAILED = ("failed while the report was finished (RuntimeError: a bug) and is left out; please report this as a "
          "nanscope bug")


def test_a_detector_that_raises_is_named_in_the_notes_and_the_rest_of_the_report_stands(monkeypatch):
    found, notes = diagnosed_with(monkeypatch, [
        (("boom-a", "boom-b"), detector_of(raises=RuntimeError("a bug"))),
        (("stable-log",), detector_of((0.5, rec("stable-log", "error")))),
    ], [(("guard-op",), detector_of((0.1, rec("guard-op", "warning"))))])
    assert found == [("stable-log", "error", ["measured"])]  # an error: the fallbacks stay quiet
    assert notes == [f"rule boom-a, boom-b {FAILED}"]


def test_a_fallback_that_raises_is_named_in_the_notes_too(monkeypatch):
    found, notes = diagnosed_with(monkeypatch, [(("stable-log",), detector_of((0.5, rec("stable-log", "info"))))], [
        (("guard-a", "guard-b"), detector_of(raises=RuntimeError("a bug"))),
        (("guard-op",), detector_of((0.1, rec("guard-op", "warning")))),
    ])
    assert found == [("guard-op", "warning", ["measured"]), ("stable-log", "info", ["measured"])]
    assert notes == [f"rule guard-a, guard-b {FAILED}"]


@pytest.mark.parametrize("severity, fallback", [("info", True), ("warning", False), ("error", False)])
def test_the_fallbacks_speak_only_when_nothing_was_found_above_info(monkeypatch, severity, fallback):
    found, notes = diagnosed_with(monkeypatch, [(("stable-log",), detector_of((0.5, rec("stable-log", severity))))],
                                  [(("guard-op",), detector_of((0.1, rec("guard-op", "warning"))))])
    assert [rule_id for rule_id, _, _ in found] == (["guard-op", "stable-log"] if fallback and severity == "info"
                                                   else ["stable-log"])
    assert notes == []


def test_findings_of_one_rule_are_merged_into_the_first_and_later_rules_still_follow(monkeypatch):
    found, _ = diagnosed_with(monkeypatch, [
        (("stable-log",), detector_of((0.9, rec("stable-log", "error", ["a", "b"])),
                                      (0.8, rec("stable-log", "error", ["b", "c"])),
                                      (0.7, rec("safe-sqrt", "error", ["d"])))),
    ], [])
    assert found == [("stable-log", "error", ["a", "b", "c"]), ("safe-sqrt", "error", ["d"])]


# The scores and severities that order the findings, each detector called on its own (diagnose would hide a
# fallback behind another rule's error, and sorts ties by detector order).
def scored(detect, report, evidence=None):
    return [(score, rec.id, rec.severity) for score, rec in detect(facts_from(report, evidence or RunEvidence()))]


def failed_run(records, phase="loss", **fields):
    """`records`, then a step whose loss is NaN, the run's first non-finite value, in `phase`."""
    number = len(records)
    return report_of([*records, step(number, loss=math.nan, loss_nonfinite=True)], first_at(number, phase, **fields))


def test_clean_input_data_scores_1():
    report = report_of([step(0), step(1)], first_at(1, "data", detail=["x: 1 non-finite value(s)"]))
    assert scored(clean_input_data.detect, report) == [(1.0, "clean-input-data", "error")]


def test_clip_gradients_scores_0_8_and_reads_the_first_steps_weight_norm_without_an_initial_one():
    records = [step(s, grad=20.0 ** s, weight_norm=1.0 + s) for s in range(4)]
    assert scored(clip_gradients.detect, failed_run(records)) == [(0.8, "clip-gradients", "error")]
    # lr 0.01 and the first step's weight norm 1: the update bound 0.01 * 1 / 0.01 = 1, under the 10th percentile 6.7.
    (_, rec), = clip_gradients.detect(facts_from(report_of(records), RunEvidence()))
    assert rec.data["threshold"] == 1.0
    assert rec.evidence[-1].startswith("clip threshold 1: so that one step of learning rate 0.01 moves the weights "
                                       "(norm 1)")


def test_clip_gradients_without_an_optimizer_config_clips_at_the_10th_percentile():
    report = report_of([step(s, grad=20.0 ** s) for s in range(4)])
    del report.run["optimizer_config"]
    (_, rec), = clip_gradients.detect(facts_from(report, RunEvidence()))
    assert rec.data["threshold"] == 7.0  # the 10th percentile of 1, 20, 400, 8000: 6.7, to one digit
    assert rec.evidence[-1] == "clip threshold 7: the 10th percentile of the healthy steps' gradient norms"


def test_loss_growth_scores_0_74_and_is_an_error_in_a_run_that_failed():
    records = [step(s, loss=20.0 ** s, update_ratio=1e-3) for s in range(4)]
    assert scored(learning_rate.detect_loss_growth, report_of(records)) == [(0.74, "lower-learning-rate", "warning")]
    assert scored(learning_rate.detect_loss_growth, report_of(records, first_at(3, "forward"))) == [
        (0.74, "lower-learning-rate", "error")]


def test_loss_growth_reads_the_update_ratios_after_the_first_step_only():
    # After the first: 1e-3, 1e-3, 1e-6, 1e-6, median 5e-4, not negligible; without the second step's it would be.
    ratios = [0.5, 1e-3, 1e-3, 1e-6, 1e-6]
    records = [step(s, loss=20.0 ** s, update_ratio=r) for s, r in enumerate(ratios)]
    assert [rule for _, rule, _ in scored(learning_rate.detect_loss_growth, report_of(records))] == [
        "lower-learning-rate"]


@pytest.mark.parametrize("optimizer, limit", [("Adam", 0.02), ("RMSprop", 0.02), ("SGD", 0.01), (None, 0.01),
                                              ("adam", 0.01)])
def test_the_update_ratio_limit_is_2e_2_for_an_adaptive_optimizer(optimizer, limit):
    run = {"optimizer": optimizer} if optimizer else {}
    assert learning_rate.update_ratio_limit(run)[0] == limit
    records = [step(s, update_ratio=0.015) for s in range(3)]
    report = report_of(records)
    report.run.update(run)
    assert bool(learning_rate.detect_update_ratio(facts_from(report, RunEvidence()))) is (limit == 0.01)


def test_bounded_activation_scores_0_65_an_error_in_a_run_that_failed_and_cites_the_growth_factor():
    records = [step(s, layer_max=(1.0, 1e30)) for s in range(3)]
    assert scored(bounded_activation.detect, report_of(records)) == [(0.65, "bounded-activation", "warning")]
    assert scored(bounded_activation.detect, failed_run(records)) == [(0.65, "bounded-activation", "error")]
    facts = facts_from(report_of(records), RunEvidence())
    facts.layers[0] = LayerFacts("hidden", "Dense", relu_like=True, called_steps=20, max_abs=2.0 ** 19,
                                 max_abs_healthy=2.0 ** 19, trend_steps=np.arange(20),
                                 trend_values=2.0 ** np.arange(20))
    (_, rec), = bounded_activation.detect(facts)
    assert rec.data["layer"] == "hidden" and rec.evidence[1] == "it grew 2x per step from step 0"


def test_bounded_activation_passes_over_a_layer_without_healthy_outputs():
    facts = facts_from(report_of([step(s, layer_max=(1e30, 1e30)) for s in range(3)]), RunEvidence())
    facts.layers[0].max_abs_healthy = None
    (_, rec), = bounded_activation.detect(facts)
    assert rec.data["layer"] == "head"


def test_bounded_activation_without_a_start_norm_or_a_healthy_step_says_nothing_of_the_weights():
    records = [step(s, weight_norm=50.0, layer_max=(1.0, 1e30)) for s in range(3)]
    zero = RunEvidence(initial_weight_norm=lambda: 0.0)  # an initial norm of 0: no growth to compare
    assert scored(bounded_activation.detect, report_of(records), zero) == [(0.65, "bounded-activation", "warning")]
    unhealthy = failed_run([])  # no healthy step: no norm, and no layer measured while healthy
    assert scored(bounded_activation.detect, unhealthy, RunEvidence(initial_weight_norm=lambda: 2.0)) == []


def guard_first(phase, op="Prod", inputs_op="Prod"):
    return first_at(0, phase, layer="hidden", op=op, source=None,
                    inputs={"min": 2.0, "max": 1e30, **({"op": inputs_op} if inputs_op else {})})


@pytest.mark.parametrize("phase, op, inputs_op, speaks", [
    ("forward", "Prod", "Prod", True), ("data", "Prod", "Prod", False), ("update", "Prod", "Prod", False),
    ("forward", None, "Prod", True), ("forward", "Prod", None, True), ("forward", None, None, False),
])
def test_guard_op_scores_0_3_for_a_named_producer_outside_the_data_and_update_phases(phase, op, inputs_op, speaks):
    report = report_of([step(0, loss=math.inf, loss_nonfinite=True)], guard_first(phase, op, inputs_op))
    assert scored(guard_op.detect, report) == ([(0.3, "guard-op", "warning")] if speaks else [])


def test_the_producer_rules_score_1_and_a_float16_overflow_0_95():
    def producer_scores(op, **inputs):
        report = report_of([step(0, loss=math.inf, loss_nonfinite=True)],
                           first_at(0, "forward", layer="hidden", op=op, inputs={"op": op, **inputs}))
        return scored(producer.detect, report)

    assert producer_scores("Log", min=0.0, max=1.0) == [(1.0, "stable-log", "error")]
    assert [score for score, _, _ in producer_scores("MatMul", dtype="float16", max=1e5)] == [0.95]
    report = report_of([step(0, loss=math.nan, loss_nonfinite=True)], first_at(
        0, "forward", layer="hidden", op="Softmax", context={"masked_rows": 2, "softmax_rows": 8}))
    assert scored(producer.detect, report) == [(1.0, "masked-softmax", "error")]


def feature(index, std):
    return FeatureScale(f"f{index}", index, std, 0.0)


@pytest.mark.parametrize("count, shown, more", [
    (5, "f4 (std 50), f3 (std 40), f2 (std 30), f1 (std 20), f0 (std 11)", ""),
    (6, "f5 (std 60), f4 (std 50), f3 (std 40), f2 (std 30), f1 (std 20)", ", and 1 more"),
    (7, "f6 (std 70), f5 (std 60), f4 (std 50), f3 (std 40), f2 (std 30)", ", and 2 more"),
])
def test_normalize_inputs_names_the_five_farthest_features_and_counts_the_rest(count, shown, more):
    features = [feature(0, 11.0)] + [feature(k, 10.0 * (k + 1)) for k in range(1, count)] + [feature(99, 1.0)]
    (score, rec), = scale.detect_inputs(facts_from(report_of([step(0)]), RunEvidence(features=features)))
    assert score == 0.6 and rec.severity == "info"
    assert rec.evidence == [f"{count} input feature(s) far from unit scale: {shown}{more}"]
    assert rec.data == {"features": list(range(count))}


def test_normalize_inputs_keeps_the_20_farthest_features_in_its_data():
    features = [feature(k, 11.0 + k) for k in range(22)]
    (_, rec), = scale.detect_inputs(facts_from(report_of([step(0)]), RunEvidence(features=features)))
    assert rec.data == {"features": list(range(2, 22))}
    assert rec.evidence[0].endswith(", and 17 more")


def test_a_spread_of_exactly_the_scale_limit_is_no_root_cause():
    # std 10 and mean |x| 11: far (the mean), but a spread of 10 is not past the limit, and an offset alone is
    # absorbed by a bias. Just above 10 the data is the root cause of a MatMul that overflowed at step 1.
    report = failed_run([step(0)], "forward", op="MatMul", inputs={"op": "MatMul", "max": 1e39})
    at = scale.detect_inputs(facts_from(report, RunEvidence(features=[FeatureScale("a", 0, 10.0, 11.0)])))
    assert [(score, rec.severity, "root_cause" in rec.data) for score, rec in at] == [(0.6, "warning", False)]
    above = scale.detect_inputs(facts_from(report, RunEvidence(features=[FeatureScale("a", 0, up(10.0), 11.0)])))
    assert [(score, rec.severity, rec.data.get("root_cause")) for score, rec in above] == [(1.05, "error", True)]


def test_normalize_targets_reads_every_target_and_names_its_output_where_it_has_one():
    targets = [TargetScale("unit", "mse", 1.0, 0.0), TargetScale(None, "mse", 20.0, 0.0),
               TargetScale("price", "mse", 2000.0, 0.0)]
    found = scale.detect_targets(facts_from(report_of([step(0)]), RunEvidence(targets=targets)))
    assert [(score, rec.data) for score, rec in found] == [
        (0.7, {"y_std": 20.0, "y_mean_abs": 0.0}), (0.8, {"y_std": 2000.0, "y_mean_abs": 0.0, "output": "price"})]
    assert [rec.evidence[0].split(" have ")[0] for _, rec in found] == ["regression targets",
                                                                        "regression targets of output 'price'"]


F, T = False, True


def skips_report(skips, before):
    """A float16 run under loss scaling at 1024 whose steps skip as `skips` says, with `before` as each step's scale
    before it (None: not recorded)."""
    records = [replace(step(s, loss_scale=1024.0, skipped=skip), loss_scale_before=before) for s, skip in
               enumerate(skips)]
    return report_of(records, dtype="float16", loss_scaling=True)


@pytest.mark.parametrize("skips, before, fell_from", [
    ([F, T, T, T, T], 4096.0, "4096"),  # recorded: read as it is
    ([F, T, T, T, T], None, "1024"),  # not recorded, the first step of the window not skipped: its own scale
    ([T] * 30, None, "2048"),  # not recorded and skipped (a warm-up of 30 is kept): twice the scale it was cut to
])
def test_a_collapsed_loss_scale_scores_0_9_and_says_the_scale_it_fell_from(skips, before, fell_from):
    (score, rec), = precision.detect(facts_from(skips_report(skips, before), RunEvidence()))
    assert (score, rec.id, rec.severity) == (0.9, "float32-layer", "error")
    assert rec.evidence[1] == f"loss scale fell from {fell_from} to 1.02e+03; no weight changed on those steps"


def test_float16_layers_score_0_65_near_overflow_and_0_5_underflowing_and_each_layer_is_read():
    report = report_of([step(0, layer_max=(1.0, 40000.0), underflow=0.5)], dtype="float16")
    report.run["layer_dtypes"]["hidden"] = "float32"  # the first layer is passed over, the second still read
    assert scored(precision.detect, report) == [(0.65, "float32-layer", "warning"), (0.5, "loss-scaling", "warning")]


@pytest.mark.parametrize("layer, fix", [
    (LayerFacts("rnn", "SimpleRNN", relu_like=True),
     "keras.layers.SimpleRNN(units, activation='relu6')  # layer rnn; or tanh, Keras' default for a recurrent layer"),
    (LayerFacts("dense", "Dense", relu_like=True),
     "keras.layers.Dense(units, activation='relu6')  # or add keras.layers.LayerNormalization() after it"),
    (LayerFacts("lstm", "LSTM"), "keras.layers.LayerNormalization()  # after layer lstm: its outputs are not bounded"),
    (LayerFacts("half", "Dense", dtype="float16"),
     "keras.layers.Dense(..., dtype='float32')  # layer half: compute it in float32"),
])
def test_the_bound_is_relu6_in_a_recurrent_layers_own_class_only_where_it_is_relu_like(layer, fix):
    assert bounded_activation.bound_for(layer) == fix


def test_check_data_rules_print_the_exact_repair_line():
    """The lines check-data prints for labels that do not fit the loss and for constant columns, word for word."""
    from nanscope.rules import drop_constant_features, fix_labels

    assert fix_labels.fix_for("sparse", 2, 6) == (
        "keep = ((y >= 0) & (y < 2) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)\n"
        "x, y = x[keep], y[keep]  # drops the 6 row(s) whose label does not fit the loss (or relabel them)")
    assert fix_labels.fix_for("sparse", None, 1).splitlines()[0] == (
        "keep = ((y >= 0) & (y % 1 == 0)).reshape(len(y), -1).all(axis=1)")
    assert fix_labels.fix_for("binary", None, 3).splitlines() == [
        "keep = ((y >= 0) & (y <= 1)).reshape(len(y), -1).all(axis=1)",
        "x, y = x[keep], y[keep]  # drops the 3 row(s) whose label does not fit the loss (or relabel them)"]
    assert fix_labels.fix_for("onehot", 3, 2) is None
    assert drop_constant_features.fix_for("inputs", [3, 4], ["country_code", "vat_rate"]) == (
        "inputs = np.delete(inputs, [3, 4], axis=-1)  # country_code, vat_rate: one value in every row")
