"""What each rule says: its evidence lines, its fix and its data, exactly, against a golden file.

The ruff and pylint catalogues test every rule's message on a sample where it fires; these
are nanscope's. Each case is a first non-finite value with a known op, phase and operand
(the producing-op rules) or a minimal run of a few steps (the step rules), and the file
`golden/rule_evidence.json` holds what the rules say about it. After an intended change of
wording, regenerate the file with `NANSCOPE_REGENERATE_GOLDEN=1 pytest
tests/test_boundaries_evidence.py` and review its diff.
"""

import json
import math
import os
from pathlib import Path

import numpy as np
import pytest

from boundary_runs import fired, first_at, report_of, step
from nanscope.jsonio import jsonable
from nanscope.rules.evidence import FeatureScale, RunEvidence, TargetScale
from nanscope.rules.outliers import glitches_in

GOLDEN = Path(__file__).parent / "golden" / "rule_evidence.json"
CRASH = [step(0, loss=math.inf, loss_nonfinite=True)]


def producer(op, dtype="float32", peak=100.0, phase="forward", context=None, **measured):
    inputs = {"op": op, "dtype": dtype, "min": 0.0, "max": peak, "zero_fraction": 0.25, "negative_fraction": 0.5,
              **measured}
    return first_at(0, phase, layer="hidden", layer_class="Dense", op=op, inputs=inputs, source="model.py:3",
                    context=context or {})


MASKED = {"masked_rows": 2, "softmax_rows": 8, "batch_rows": [1, 3], "positions": [[0, 2], [1, 5]],
          "fill": {"op": "SelectV2", "source": "attn.py:7"}}
WHERE = {"discarded_by": {"op": "SelectV2", "source": "model.py:9"}, "forward_nonfinite": 3}
CASES = {
    "masked-softmax float16": (lambda: producer("Softmax", "float16", 1.0, context=MASKED), {}),
    "masked-softmax float32": (lambda: producer("Softmax", "float32", 1.0, context=MASKED), {}),
    "double-where Log": (lambda: producer("Log", phase="backward", context=WHERE), {}),
    "double-where Sqrt": (lambda: producer("Sqrt", phase="backward", context=WHERE), {}),
    "double-where RealDiv": (lambda: producer("RealDiv", phase="backward", context=WHERE), {}),
    "stable-log forward": (lambda: producer("Log"), {}),
    "stable-log backward": (lambda: producer("Log", phase="backward"), {}),
    "stable-exp float32": (lambda: producer("Exp"), {}),
    "stable-exp float16": (lambda: producer("Exp", "float16"), {}),
    "safe-division loss": (lambda: producer("RealDiv", phase="loss"), {}),
    "safe-sqrt forward": (lambda: producer("Sqrt"), {}),
    "safe-sqrt backward": (lambda: producer("Sqrt", phase="backward"), {}),
    "loss-scaling float16 op": (lambda: producer("MatMul", "float16", 1.0, phase="backward"), {}),
    "float32-layer float16 op in the forward pass": (lambda: producer("MatMul", "float16", 1.0), {}),
    "float32-layer float16 op with loss scaling": (lambda: producer("MatMul", "float16", 1.0), {"loss_scaling": True}),
    "optimizer-epsilon": (lambda: producer("Sqrt", peak=1.0, phase="update"), {"update": True}),
    # the double where: the forward op named by the replay, not the gradient op; no sources, no forward count known
    "double-where Rsqrt unsourced": (lambda: first_at(0, "backward", layer="hidden", op="Mul", source=None,
                                                      inputs={"op": "Rsqrt", "min": 0.0, "max": 4.0,
                                                              "zero_fraction": 0.5, "negative_fraction": 0.0},
                                                      context={"discarded_by": {"op": "Select"}}), {}),
    "double-where Tan": (lambda: producer("Tan", phase="backward", context={"discarded_by": {"op": "SelectV2"}}), {}),
    "double-where Log without the op measured": (lambda: first_at(0, "backward", layer="hidden", op="Log",
                                                                  source="m.py:1", inputs={"min": 0.0},
                                                                  context=WHERE), {}),
    # the unsafe-op rules: each branch of what they say about the operand the replay measured
    "safe-pow negative base": (lambda: producer("Pow", exponent_min=1 / 3, exponent_max=1 / 3), {}),
    "safe-pow zero base": (lambda: producer("Pow", negative_fraction=0.0, exponent_min=-1.0, exponent_max=-1.0), {}),
    "safe-pow overflow": (lambda: producer("Pow", min=2.0, zero_fraction=0.0, negative_fraction=0.0,
                                           exponent_min=2.5, exponent_max=3.0), {}),
    "safe-pow backward zero base": (lambda: producer("Pow", phase="backward", negative_fraction=0.0,
                                                     exponent_min=0.5, exponent_max=0.5), {}),
    "safe-pow backward": (lambda: producer("Pow", phase="backward", min=1.0, zero_fraction=0.0,
                                           negative_fraction=0.0, exponent_min=math.inf, exponent_max=2.0), {}),
    "clamp-inverse-trig Acos": (lambda: producer("Acos", min=-0.5, max=1.0000001, zero_fraction=0.0,
                                                 negative_fraction=0.25), {}),
    "clamp-inverse-trig Asin backward float16": (lambda: producer("Asin", "float16", phase="backward", min=-1.0,
                                                                  max=0.5, zero_fraction=0.0), {}),
    "clamp-inverse-trig Atanh in range": (lambda: producer("Atanh", min=-0.5, max=0.5, zero_fraction=0.0), {}),
    "finite-logits": (lambda: producer("Softmax", nonfinite=3, min=-2.0, max=5.0, zero_fraction=0.0), {}),
    "avoid-poles Lgamma": (lambda: producer("Lgamma", peak=3.0), {}),
    "avoid-poles Digamma backward": (lambda: producer("Digamma", phase="backward", peak=3.0), {}),
    "avoid-poles Xlogy": (lambda: producer("Xlogy", operand="y", negative_fraction=0.0), {}),
    "avoid-poles Xlog1py": (lambda: producer("Xlog1py", min=-1.0, zero_fraction=0.0), {}),
    "avoid-poles Log1p": (lambda: producer("Log1p", min=-1.5, zero_fraction=0.0), {}),
    "guard-op Prod": (lambda: producer("Prod", min=2.0, max=1e30, zero_fraction=0.0, negative_fraction=0.0), {}),
}


def growing(field, rate, n=6, **fixed):
    return [step(s, **{field: rate ** s}, **fixed) for s in range(n)]


SCALES = RunEvidence(targets=[TargetScale("price", "mse", 2000.0, 30.0)],
                     features=[FeatureScale("a", 0, 50.0, 1.0), FeatureScale("b", 1, 1.0, 1.0)])
GLITCHED = np.array([-1.0] * 30 + [0.0] * 39 + [1.0] * 30 + [9999.0]).reshape(-1, 1)
GLITCHES = RunEvidence(glitches=glitches_in(np.zeros((100, 1)), GLITCHED),
                       batch_rows=lambda s: np.array([99 if s == 21 else 0]))
RUNS = {
    "clip-gradients growth": (lambda: report_of(growing("grad", 10.0)), RunEvidence()),
    "clip-gradients in a failed run": (lambda: report_of([*growing("grad", 10.0),
                                                          step(6, loss=math.nan, loss_nonfinite=True)], first_at(6)),
                                       RunEvidence(initial_weight_norm=lambda: 3.0)),
    "lower-learning-rate update ratio": (lambda: report_of([
        step(s, update_ratio=0.05) for s in range(6)]), RunEvidence()),
    "lower-learning-rate loss growth": (lambda: report_of(growing("loss", 10.0)), RunEvidence()),
    "weight-constraint": (lambda: report_of(growing("weight_norm", 2.0, n=8)), RunEvidence()),
    "normalize scales in a failed run": (lambda: report_of(CRASH, first_at(0, "forward")), SCALES),
    "float16 layers": (lambda: report_of([step(0, layer_max=(1.0, 40000.0), underflow=0.5)], dtype="float16"),
                       RunEvidence()),
    "collapsed loss scale": (lambda: report_of([step(s, loss_scale=2.0 ** (10 - s), skipped=s > 0) for s in range(6)],
                                               dtype="float16", loss_scaling=True), RunEvidence()),
    "drop-outlier-rows spike": (lambda: report_of([step(s, loss=1.0 if s < 21 else 500.0) for s in range(22)]),
                                GLITCHES),
}


def said(name):
    if name in RUNS:
        make, evidence = RUNS[name]
        report = make()
    else:
        make, how = CASES[name]
        records = [step(0, weights_nonfinite=1)] if how.get("update") else CRASH
        report = report_of(records, make(), loss_scaling=how.get("loss_scaling", False))
        evidence = RunEvidence(batch_rows=lambda s: np.arange(40, 48))
    found = fired(report, evidence)
    return {rid: jsonable({"severity": r.severity, "evidence": r.evidence, "fix": r.fix, "data": r.data})
            for rid, r in found.items()}


def golden():
    return json.loads(GOLDEN.read_text(encoding="utf-8"))


def test_regenerate_the_golden_file_when_asked():
    if not os.environ.get("NANSCOPE_REGENERATE_GOLDEN"):
        pytest.skip("set NANSCOPE_REGENERATE_GOLDEN=1 to rewrite golden/rule_evidence.json")
    GOLDEN.write_text(json.dumps({name: said(name) for name in [*CASES, *RUNS]}, indent=1, ensure_ascii=False) + "\n",
                      encoding="utf-8")


@pytest.mark.parametrize("name", [*CASES, *RUNS])
def test_each_rule_says_what_the_golden_file_holds(name):
    assert said(name) == golden()[name]
