"""--verify ranks by what it measured, and tries natural combinations when each fix fails alone."""

from pathlib import Path

from nanscope.rules.catalogue import recommend
from nanscope.spec import parse_spec
from nanscope.trace import TraceOptions, run_trace
from nanscope.verify import ranked_by_verification

DATA = Path(__file__).parent / "specs" / "scaled_data.py"


def trace(tmp_path, x_scale, y_scale, lr, verify=True):
    doc = {
        "model": {"factory": f"{DATA}:mlp"},
        "data": {"factory": f"{DATA}:arrays", "args": {"x_scale": x_scale, "y_scale": y_scale}, "batch_size": 32,
                 "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": lr}, "steps": 40, "seed": 0},
    }
    return run_trace(parse_spec(doc, source=str(tmp_path / "spec.yaml")),
                     TraceOptions(trace_path=tmp_path / "t.jsonl", verify=verify))


def test_a_verified_fix_ranks_above_one_that_was_tried_and_failed(tmp_path):
    # Inputs of std 1000 make the run diverge; targets of std 2000 alone do not, so standardising
    # them keeps the divergence. Unverified, the larger targets' scale ranks first.
    plain = trace(tmp_path, 1000.0, 2000.0, 3e-4, verify=False)
    assert [r.id for r in plain.recommendations][:2] == ["normalize-targets", "normalize-inputs"]
    report = trace(tmp_path, 1000.0, 2000.0, 3e-4)
    assert [(r.id, r.verified) for r in report.recommendations] == [("normalize-inputs", True),
                                                                   ("normalize-targets", False)]
    assert [r["id"] for r in report.to_json()["recommendations"]] == ["normalize-inputs", "normalize-targets"]


def test_inputs_and_targets_standardised_together_when_each_fails_alone(tmp_path):
    report = trace(tmp_path, 100.0, 1e4, 0.01)
    by_id = {r.id: r for r in report.recommendations}
    for rule_id, other in (("normalize-inputs", "normalize-targets"), ("normalize-targets", "normalize-inputs")):
        rows = by_id[rule_id].verification
        alone, together = rows[0], rows[-1]
        assert not alone["helped"]
        assert together["fix"] == "standardise x + standardise y" and together["together_with"] == [other]
        assert together["finite"] and together["helped"] and together["steps_run"] == 40
        assert by_id[rule_id].verified is True and by_id[rule_id].data["verified_with"] == [other]


def test_ranking_keeps_the_diagnosis_order_within_each_group():
    recs = [recommend(rule, "error", []) for rule in ("stable-log", "clip-gradients", "lower-learning-rate",
                                                      "normalize-inputs")]
    recs[1].verified, recs[2].verified, recs[3].verified = False, True, True
    assert [r.id for r in ranked_by_verification(recs)] == ["lower-learning-rate", "normalize-inputs", "stable-log",
                                                           "clip-gradients"]
