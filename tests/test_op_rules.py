"""The op rules for unsafe ops (safe-pow, clamp-inverse-trig, avoid-poles, finite-logits) and the guard-op fallback
cite what the replay measured: the op, its operand against its domain, a Pow's exponent, an Xlogy's log argument.

The programs are the realistic corpus's fixtures (tests/realistic); that they are buggy in plain Keras, and that
their fixed forms train, is established there.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from nanscope.rules import domains
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

HERE = Path(__file__).parent
_spec = importlib.util.spec_from_file_location("realistic_cases", HERE / "realistic" / "cases.py")
cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cases)


def trace(name, tmp_path):
    doc = cases.BUGGY[name][0]
    spec = parse_spec(doc, source=str(tmp_path / f"{name}.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))


def test_gem_pooling_names_the_pow_its_negative_base_and_its_fractional_exponent(tmp_path):
    report = trace("gem-pooling-without-clamp", tmp_path)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op, first.layer) == (0, "forward", "Pow", "gem")
    assert first.inputs["exponent_min"] == first.inputs["exponent_max"] == float(np.float32(1 / 3))
    assert first.inputs["negative_fraction"] > 0
    top = report.recommendations[0]
    assert (top.id, top.severity) == ("safe-pow", "error")
    assert "exponent 0.3333 (not an integer)" in top.evidence[0] and "tf.maximum(x, 1e-6)" in top.fix


def test_poisson_xlogy_describes_the_log_argument_not_the_counts(tmp_path):
    report = trace("poisson-relu-rate", tmp_path)
    first = report.first_nonfinite
    assert (first.op, first.inputs["operand"]) == ("Xlogy", "log argument")
    assert first.inputs["min"] == 0.0 and first.inputs["zero_fraction"] > 0  # the relu rate, not y_true
    assert report.recommendations[0].id == "avoid-poles"


def test_arcface_names_the_acos_whose_gradient_is_infinite_at_a_cosine_of_exactly_1(tmp_path):
    # The relu embedding has 3 units: a row with one positive unit normalises to exactly a class centre, so the cosine
    # is exactly 1 at step 0 and Acos' gradient -1/sqrt(1 - x^2) is -inf (a cosine rounded past 1 is the forward case,
    # which tests/golden/rule_evidence.json pins on its own).
    report = trace("arcface-2d-unclamped", tmp_path)
    first = report.first_nonfinite
    assert (first.step, first.phase, first.op, first.layer) == (0, "backward", "Reciprocal", "arc")
    assert (first.inputs["op"], first.inputs["max"], first.inputs["negative_fraction"]) == ("Acos", 1.0, 0.0)
    top = report.recommendations[0]
    assert (top.id, top.severity) == ("clamp-inverse-trig", "error")
    assert "Reciprocal (gradient of Acos)" in top.evidence[0] and "reaches exactly 1" in top.evidence[0]
    assert "tf.clip_by_value(x, -1.0 + 1e-7, 1.0 - 1e-7)" in top.fix


def test_an_op_without_a_rule_gets_guard_op_when_nothing_else_explains_the_run(tmp_path):
    report = trace("compound-growth-product", tmp_path)
    assert report.first_nonfinite.op == "Prod"
    alarms = [r for r in report.recommendations if r.severity != "info"]
    assert [(r.id, r.severity) for r in alarms] == [("guard-op", "warning")]  # a fallback: nothing else explains it
    guard = alarms[0]
    assert "log space" in guard.fix
    assert "the result overflowed" in guard.evidence[0]


@pytest.mark.parametrize("op,inputs,backward,outside", [
    ("Acos", {"min": 0.0, "max": 1.0000001}, False, True),
    ("Acos", {"min": 0.0, "max": 1.0}, False, False),
    ("Acos", {"min": 0.0, "max": 1.0}, True, True),
    ("Pow", {"min": 0.0, "max": 1.0, "zero_fraction": 0.1}, True, True),
    ("Pow", {"min": 0.1, "max": 1.0}, True, False),
    ("Log1p", {"min": -1.0, "max": 2.0}, False, True),
    ("Log1p", {"min": -0.999, "max": 2.0}, False, False),
    ("Lgamma", {"min": 0.0, "max": 2.0, "zero_fraction": 0.5}, False, True),
    ("Prod", {"min": 0.0, "max": 2.0, "zero_fraction": 0.5}, False, False),
])
def test_the_domain_table_says_when_an_operand_is_outside(op, inputs, backward, outside):
    assert (domains.outside(op, inputs, backward) is not None) == outside
