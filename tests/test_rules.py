"""Rules fire on the purpose-built specs in tests/specs, name the producer, and stay quiet on healthy runs."""

import os

os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

from pathlib import Path

import pytest

from nanscope.rules.catalogue import RULES
from nanscope.spec.load import load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
MODELS = "tests/specs/models.py"
REPO = Path(__file__).parent.parent
RULE_IDS = ("clean-input-data", "drop-outlier-rows", "normalize-inputs", "normalize-targets", "lower-learning-rate",
            "clip-gradients", "bounded-activation", "stable-log", "stable-exp", "safe-division", "safe-sqrt",
            "loss-scaling", "float32-layer", "optimizer-epsilon", "weight-constraint", "fix-labels",
            "drop-constant-features", "masked-softmax", "double-where", "safe-pow", "clamp-inverse-trig", "avoid-poles",
            "finite-logits", "guard-op")


def producer_line(tag):
    """The line number of `# producer: tag` in tests/specs/models.py."""
    lines = (SPECS / "models.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if f"# producer: {tag}" in line)


def trace(name, tmp_path, **options):
    return run_trace(load_spec(SPECS / f"{name}.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl", **options))


def ids(report):
    return [r.id for r in report.recommendations]


# (spec, phase, layer class, op, producer tag, expected first rule)
CASES = [
    ("exp-overflow", "forward", "ExpFeatures", "Exp", "exp", "stable-exp"),
    ("division-by-zero", "forward", "RatioFeatures", "RealDiv", "div", "safe-division"),
    ("sqrt-at-zero", "backward", "RootFeatures", "SqrtGrad", "sqrt", "safe-sqrt"),
    ("log-of-softmax", "loss", None, "Log", "log", "stable-log"),
]


@pytest.mark.parametrize("name,phase,layer_class,op,tag,rule", CASES)
def test_producer_op_layer_and_line_are_named(name, phase, layer_class, op, tag, rule, tmp_path):
    report = trace(name, tmp_path)
    first = report.first_nonfinite
    assert (first.phase, first.layer_class, first.op) == (phase, layer_class, op)
    assert first.source.endswith(f"models.py:{producer_line(tag)}")
    assert ids(report)[0] == rule
    assert report.recommendations[0].severity == "error"


def test_exp_evidence_cites_the_overflow_bound(tmp_path):
    first = trace("exp-overflow", tmp_path).first_nonfinite
    assert first.inputs["max"] > 88.72


def test_log_evidence_cites_zero_input(tmp_path):
    first = trace("log-of-softmax", tmp_path).first_nonfinite
    assert first.inputs["min"] == 0.0 and first.inputs["zero_fraction"] > 0


def test_nan_rows_recommend_clean_input_data(tmp_path):
    report = trace("nan-data", tmp_path)
    assert report.first_nonfinite.phase == "data"
    assert ids(report)[0] == "clean-input-data"
    assert any("rows 5" in line for line in report.first_nonfinite.detail)


def test_exploding_regression_recommends_clipping_or_lower_lr_first(tmp_path):
    report = trace("exploding", tmp_path)
    assert report.status == "nonfinite"
    assert set(ids(report)[:2]) == {"clip-gradients", "lower-learning-rate"}


def test_healthy_run_has_no_warning(tmp_path):
    report = trace("healthy", tmp_path)
    assert report.status == "healthy"
    assert not [r for r in report.recommendations if r.severity in ("error", "warning")]


def test_same_evidence_gives_same_recommendations(tmp_path):
    # Layer names get a numeric suffix per model built in one process; everything else must match.
    def findings():
        return [(r.id, {k: v for k, v in r.data.items() if k != "layer"}) for r in trace("division-by-zero",
                                                                                         tmp_path).recommendations]

    first, second = findings(), findings()
    assert first == second


def test_catalogue_has_every_rule_with_a_docs_page():
    assert set(RULE_IDS) == set(RULES)
    for rule in RULES.values():
        assert rule.title and rule.detects and rule.fix
        assert (REPO / rule.docs).is_file(), rule.docs
