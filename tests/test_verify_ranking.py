"""--verify ranks by what it measured, and tries natural combinations when each fix fails alone."""

from pathlib import Path

from nanscope.rules.catalogue import recommend
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions
from nanscope.run.verify import ranked_by_verification

DATA = Path(__file__).parent / "specs" / "scaled_data.py"


def trace(tmp_path, x_scale, y_scale, lr, verify=True, steps=40):
    doc = {
        "model": {"factory": f"{DATA}:mlp"},
        "data": {"factory": f"{DATA}:arrays", "args": {"x_scale": x_scale, "y_scale": y_scale}, "batch_size": 32,
                 "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": lr}, "steps": steps, "seed": 0},
    }
    return run_trace(parse_spec(doc, source=str(tmp_path / "spec.yaml")),
                     TraceOptions(trace_path=tmp_path / "t.jsonl", verify=verify))


def test_a_fix_that_stays_finite_but_does_not_learn_is_reported_as_such_and_not_verified(tmp_path):
    """Inputs of std 1000 make the run diverge at step 2. Standardised, they keep it finite for all 40 steps, but
    SGD at 3e-4 on targets of std 2000 ends above predicting their mean: finite, and no fix (the old verdict
    called it verified). Standardising the targets too stays finite and ends above its baseline as well."""
    report = trace(tmp_path, 1000.0, 2000.0, 3e-4)
    by_id = {r.id: r for r in report.recommendations}
    alone = by_id["normalize-inputs"].verification[0]
    assert (alone["fix"], alone["finite"], alone["steps_run"]) == ("standardise x", True, 40)
    assert alone["verdict"] == "stays finite but does not learn" and alone["learns"] is False
    assert alone["judged_loss"] > 0.99 * alone["baseline"] and alone["baseline_rows"] == "training"
    together = by_id["normalize-inputs"].verification[-1]
    assert together["fix"] == "standardise x + standardise y" and together["verdict"] == alone["verdict"]
    assert by_id["normalize-inputs"].verified is False and by_id["normalize-targets"].verified is False


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


def test_fixes_that_train_rank_by_their_loss_relative_to_their_baseline():
    """Standardised targets change the loss's units: fixes are compared on loss / baseline, the lowest first."""
    recs = [recommend(rule, "error", []) for rule in ("clip-gradients", "normalize-targets", "stable-log")]
    recs[0].verified, recs[1].verified = True, True
    recs[0].verification = [{"helped": True, "relative_loss": 0.65, "judged_loss": 28484.0}]
    recs[1].verification = [{"helped": True, "relative_loss": 0.19, "judged_loss": 0.19},
                            {"helped": False, "relative_loss": None, "judged_loss": 0.01}]
    assert [r.id for r in ranked_by_verification(recs)] == ["normalize-targets", "clip-gradients", "stable-log"]
