"""Mixed precision: float16 layers, loss scaling, float16 overflow, a collapsed loss scale."""

from pathlib import Path

from nanscope.runtime import tensorflow
from nanscope.spec import parse_spec
from nanscope.trace import TraceOptions, run_trace

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"


def run(tmp_path, factory, steps=6, scale=1.0, policy="mixed_float16", verify=False):
    document = {
        "model": {"factory": f"{SPECS / 'precision_models.py'}:{factory}"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": steps, "seed": 0,
                  "mixed_precision": policy},
    }
    if scale != 1.0:
        document["data"]["args"] = {"scale": scale}
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl", keep_going=not verify, verify=verify))


def test_float16_run_reports_dtypes_and_loss_scale_and_restores_the_policy(tmp_path):
    before = keras.mixed_precision.dtype_policy().name
    report = run(tmp_path, "mlp")
    assert keras.mixed_precision.dtype_policy().name == before
    assert report.run["layer_dtypes"] == {"hidden": "float16", "out": "float32"}
    assert report.run["loss_scaling"] is True
    assert all(r.loss_scale is not None and r.loss_scale > 0 for r in report.records)
    assert report.status == "healthy"
    layers = {row["name"]: row for row in report.to_json()["layers"]}
    assert layers["hidden"]["dtype"] == "float16"


def test_bfloat16_needs_no_loss_scaling(tmp_path):
    report = run(tmp_path, "mlp", policy="mixed_bfloat16")
    assert report.run["loss_scaling"] is False and report.run["layer_dtypes"]["hidden"] == "bfloat16"
    assert report.first_nonfinite is None


def test_float16_overflow_in_the_forward_pass(tmp_path):
    report = run(tmp_path, "mlp", scale=1e5)
    first = report.first_nonfinite
    assert first.phase == "forward" and first.layer == "hidden"
    ids = [r.id for r in report.recommendations]
    # A LossScaleOptimizer is already in use: loss scaling cannot help a forward overflow.
    assert "float32-layer" in ids[:3] and "loss-scaling" not in ids


def test_collapsed_loss_scale_is_an_error_finding(tmp_path):
    report = run(tmp_path, "infinite_gradient", steps=12)
    assert all(r.update_skipped for r in report.records)
    assert report.records[-1].loss_scale < report.records[0].loss_scale
    assert report.first_nonfinite is None  # skipped updates leave the weights finite
    top = report.recommendations[0]
    assert top.id == "float32-layer" and top.severity == "error" and "skipped 12 of the last 12" in top.evidence[0]
    assert "loss-scaling" not in [r.id for r in report.recommendations]
    assert report.status == "warning"


def test_verify_tries_loss_scaling_on_float16_layers_that_lack_it(tmp_path):
    report = run(tmp_path, "float16_layers", scale=1e5, policy=None, verify=True)
    assert report.run["loss_scaling"] is False and report.run["layer_dtypes"]["hidden"] == "float16"
    rec = next(r for r in report.recommendations if r.id == "loss-scaling")
    assert [row["fix"] for row in rec.verification] == ["loss scaling"]
    # The overflow is in the forward pass, before any gradient: scaling the loss cannot prevent it.
    assert rec.verified is False and rec.verification[0]["finite"] is False
