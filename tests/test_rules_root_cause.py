"""Root cause before symptom, on minimal runs at its threshold.

A run that goes non-finite within its first 5 steps (steps 0-4) with inputs or targets far from unit scale, at
an op that overflowed or underflowed, ranks the scale rule first, at error level, above the op's guard; at step
5, or at a domain edge no scaling moves (a zero denominator), the op's rule stays first. The threshold is written
out, not imported: a changed constant fails a test here.
"""

import math

import pytest

from boundary_runs import fired, first_at, ranked, report_of, step
from nanscope.rules.evidence import FeatureScale, RunEvidence, TargetScale

EXP = {"op": "Exp", "operand": "input", "dtype": "float32", "min": -3.0, "max": 200.0, "zero_fraction": 0.0,
       "negative_fraction": 0.5}
DIVISION = {"op": "RealDiv", "operand": "denominator", "dtype": "float32", "min": 0.0, "max": 2.0,
            "zero_fraction": 0.25, "negative_fraction": 0.0}


def far_inputs(std=500.0):
    return RunEvidence(features=[FeatureScale("x[0]", 0, std, std)])


def failing(at, inputs, steps_before=None, **columns):
    records = [step(s, **columns) for s in range(at if steps_before is None else steps_before)]
    records.append(step(at, loss=math.inf, loss_nonfinite=True))
    return report_of(records, first_at(at, "forward", layer="hidden", layer_class="Dense", op=inputs["op"],
                                       inputs=dict(inputs), source="model.py:3"))


@pytest.mark.parametrize("at, first", [(0, "normalize-inputs"), (4, "normalize-inputs"), (5, "stable-exp")])
def test_unscaled_inputs_rank_above_an_exp_overflow_in_the_first_5_steps(at, first):
    report = failing(at, EXP)
    found = fired(report, far_inputs())
    assert ranked(report, far_inputs())[:2] == [first, ({"normalize-inputs", "stable-exp"} - {first}).pop()]
    assert found["stable-exp"].severity == "error"
    # std 500 is below the extreme spread (1000): without the root cause the scale is a warning.
    assert found["normalize-inputs"].severity == ("error" if at < 5 else "warning")
    assert found["normalize-inputs"].data.get("root_cause", False) is (at < 5)


def test_a_zero_denominator_keeps_its_rule_first_whatever_the_inputs_scale():
    report = failing(0, DIVISION)
    assert ranked(report, far_inputs())[:2] == ["safe-division", "normalize-inputs"]
    assert fired(report, far_inputs())["normalize-inputs"].severity == "warning"


def test_inputs_at_unit_scale_are_no_root_cause():
    assert "normalize-inputs" not in fired(failing(0, EXP), far_inputs(std=10.0))  # the limit is > 10


@pytest.mark.parametrize("std, mean, severity", [(500.0, 500.0, "error"), (1.0, 5000.0, "warning")])
def test_targets_spread_not_their_offset_is_a_root_cause(std, mean, severity):
    evidence = RunEvidence(targets=[TargetScale(None, "mse", std, mean)])
    found = fired(failing(0, EXP), evidence)
    assert found["normalize-targets"].severity == severity
    assert ranked(failing(0, EXP), evidence)[0] == ("normalize-targets" if severity == "error" else "stable-exp")
