"""trace-steps: the instrumented step against an eager reference, phases, examples, model and data kinds."""

import inspect
import json
from pathlib import Path

import numpy as np
import pytest

from nanscope.engine.step import InstrumentedStep
from nanscope.run.losses import Loss
from nanscope.model.models import from_keras
from nanscope.runtime import tensorflow
from nanscope.spec.load import load_spec, parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions
from nanscope.store.tracefile import read_trace

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"
CONFIGS = Path(__file__).parent.parent / "configs"


def spec_dict(model, loss="mse", lr=0.01, steps=5, data=None, optimizer=None, **train):
    return {
        "model": {"factory": f"{SPECS / 'phase_models.py'}:{model}"},
        "data": data or {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16, "shuffle": False},
        "train": {"loss": loss, "optimizer": optimizer or {"name": "sgd", "learning_rate": lr}, "steps": steps,
                  "seed": 0, **train},
    }


def trace(tmp_path, document, **options):
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(trace_path=tmp_path / "trace.jsonl", **options))


def test_step_statistics_equal_an_eager_reference():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(1)])
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 4)).astype(np.float32)
    y = rng.standard_normal((8, 1)).astype(np.float32)
    weights = [v.numpy() for v in model.trainable_variables]
    with tf.GradientTape() as tape:
        hidden = model.layers[0](x)
        out = model.layers[1](hidden)
        loss = tf.reduce_mean(tf.square(y - out))
    grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    hidden, out = hidden.numpy(), out.numpy()

    step = InstrumentedStep(from_keras(model, "test"), Loss(keras.losses.MeanSquaredError(), "mse"),
                            keras.optimizers.SGD(0.1), x, y)
    record = step.run(0, x, y)

    assert record.loss == pytest.approx(float(loss), rel=1e-5)
    assert record.grad_global_norm == pytest.approx(np.sqrt(sum((g ** 2).sum() for g in grads)), rel=1e-5)
    for stats, g, w in zip(record.variables, grads, weights):
        assert stats.grad_norm == pytest.approx(np.linalg.norm(g), rel=1e-5)
        assert stats.weight_norm == pytest.approx(np.linalg.norm(w - 0.1 * g), rel=1e-5)
        expected_ratio = np.linalg.norm(0.1 * g) / np.linalg.norm(w - 0.1 * g)
        assert stats.update_ratio == pytest.approx(expected_ratio, rel=1e-4)
    for stats, output in zip(record.layers, (hidden, out)):
        assert stats.max_abs == pytest.approx(np.abs(output).max(), rel=1e-6)
        assert stats.mean_abs == pytest.approx(np.abs(output).mean(), rel=1e-6)
        assert stats.zero_fraction == pytest.approx((output == 0).mean())
        assert stats.nonfinite == 0
    assert record.phase is None
    # The model kept nothing of the probes.
    assert "call" not in model.layers[0].__dict__


def test_data_phase_names_features_and_rows(tmp_path):
    data = {"factory": f"{SPECS / 'data_factories.py'}:arrays", "args": {"nan_rows": [20, 21]},
            "batch_size": 16, "shuffle": False}
    report = trace(tmp_path, spec_dict("dense", data=data))
    first = report.first_nonfinite
    assert (first.step, first.phase) == (1, "data")  # rows 16-31 are batch 1
    assert "x[1]" in first.detail[0] and "20, 21" in first.detail[0]
    assert report.recommendations[0].id == "clean-input-data"
    assert report.exit_code() == 1


def test_forward_phase_names_the_producing_layer(tmp_path):
    report = trace(tmp_path, spec_dict("forward_nan"))
    first = report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.layer_class) == (0, "forward", "log", "LogOfInput")


def test_loss_phase(tmp_path):
    report = trace(tmp_path, spec_dict("dense", loss=f"{SPECS / 'phase_models.py'}:log_loss"))
    assert report.first_nonfinite.phase == "loss"


def test_backward_phase_names_a_variable(tmp_path):
    report = trace(tmp_path, spec_dict("backward_nan"))
    first = report.first_nonfinite
    assert (first.step, first.phase) == (0, "backward")
    assert first.variable.startswith("hidden/")


def test_update_phase_when_the_step_overflows_the_weights(tmp_path):
    report = trace(tmp_path, spec_dict("dense", lr=3e38))
    first = report.first_nonfinite
    assert first.phase == "update"
    assert report.records[first.step].grad_nonfinite == 0


def test_exploding_regression_goes_nonfinite_within_the_first_epoch(tmp_path):
    report = run_trace(load_spec(CONFIGS / "exploding-regression.yaml"), TraceOptions(trace_path=tmp_path / "t.jsonl"))
    assert report.status == "nonfinite"
    first = report.first_nonfinite
    # README: "non-finite at step 8 of the first epoch, in the `loss` phase": the gradient norm grows ~53x a step
    # from step 0 until step 8's squared error overflows float32 (the forensic replay names Square).
    assert (first.step, first.phase, first.op) == (8, "loss", "Square")
    # README: "It recommends, in order, clip-gradients ..., lower-learning-rate, normalize-targets and
    # weight-constraint"; the layer output grew on the way, but with the weights (bounded-activation, info only).
    assert [(r.id, r.severity) for r in report.recommendations] == [
        ("clip-gradients", "error"), ("lower-learning-rate", "error"), ("normalize-targets", "warning"),
        ("weight-constraint", "error"), ("bounded-activation", "info")]
    growth = report.recommendations[0].data
    assert growth["onset_step"] == 0 and growth["growth_rate"] == pytest.approx(53.0, rel=0.01)
    assert report.steps_run == 9  # stops at the first non-finite step: steps 0-8


def test_clipped_twin_trains(tmp_path):
    spec = load_spec(CONFIGS / "exploding-regression-clipnorm.yaml")
    spec.train.steps = 300
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "t.jsonl"))
    assert report.status == "healthy"
    assert report.records[-1].loss < report.records[0].loss / 100
    # The clipped model also fits the validation rows: their loss after 300 steps (192 with this seed) is below a
    # hundredth of the first training loss (28,495), as the training loss is.
    assert report.validation_loss < report.records[0].loss / 100


def test_healthy_classification_has_no_warnings(tmp_path):
    report = run_trace(load_spec(CONFIGS / "healthy-classification.yaml"),
                       TraceOptions(trace_path=tmp_path / "t.jsonl"))
    assert report.status == "healthy"
    assert report.recommendations == []  # standardised inputs, a small learning rate: no rule fires, not even info
    assert report.exit_code(strict=True) == 0


def test_same_seed_same_run(tmp_path):
    first = trace(tmp_path, spec_dict("dense", steps=6))
    second = trace(tmp_path, spec_dict("dense", steps=6))
    assert [r.loss for r in first.records] == [r.loss for r in second.records]


def test_keep_going_runs_to_the_step_limit(tmp_path):
    report = trace(tmp_path, spec_dict("forward_nan", steps=3), keep_going=True)
    assert report.steps_run == 3 and report.first_nonfinite.step == 0


@pytest.mark.parametrize("factory,layers", [
    ("functional", {"a", "b", "merge", "out"}),
    ("subclassed", {"first", "second"}),
])
def test_every_model_kind_gets_layer_statistics(tmp_path, factory, layers):
    report = trace(tmp_path, spec_dict(factory, steps=2))
    assert {name for name, _ in report.layers} == layers
    assert all(row["max_abs"] > 0 for row in report.layer_summaries())


def test_layer_loss_terms_are_attributed(tmp_path):
    report = trace(tmp_path, spec_dict("regularized", steps=2))
    terms = {row["name"]: row["loss_term_last"] for row in report.layer_summaries()}
    assert terms["reg"] > 0 and terms["out"] == 0


def test_compiled_model_supplies_loss_and_optimizer(tmp_path):
    document = spec_dict("compiled", steps=2)
    del document["train"]["loss"], document["train"]["optimizer"]
    report = trace(tmp_path, document)
    assert report.run["optimizer"] == "SGD" and report.steps_run == 2


def test_keras_file_and_saved_model(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(1)])
    model.save(tmp_path / "m.keras")
    # Keras before 3.4 has no `verbose` here (the oldest-versions smoke run, .ci/run).
    quiet = {"verbose": False} if "verbose" in inspect.signature(model.export).parameters else {}
    model.export(str(tmp_path / "saved"), format="tf_saved_model", **quiet)
    data = {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16}
    for path in ("m.keras", "saved"):
        document = {"model": {"path": path}, "data": data, "train": {"loss": "mse", "optimizer": "sgd", "steps": 3}}
        report = trace(tmp_path, document)
        assert report.steps_run == 3 and report.first_nonfinite is None
        if path == "saved":
            assert report.layers == [] and len(report.variables) == 4
            assert any("grouped by variable" in note for note in report.notes)


def test_file_data_sources(tmp_path):
    x, y = np.random.default_rng(0).standard_normal((40, 3)).astype(np.float32), np.ones((40, 1), np.float32)
    np.savez(tmp_path / "d.npz", x=x, y=y)
    rows = "\n".join(",".join(f"{v:.4f}" for v in (*row, t)) for row, t in zip(x, y[:, 0]))
    (tmp_path / "d.csv").write_text("a,b,c,target\n" + rows + "\n")
    with tf.io.TFRecordWriter(str(tmp_path / "d.tfrecord")) as writer:
        for row, t in zip(x, y):
            features = {"x": tf.train.Feature(float_list=tf.train.FloatList(value=row)),
                        "y": tf.train.Feature(float_list=tf.train.FloatList(value=t))}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    sources = [
        {"path": "d.npz"},
        {"path": "d.csv", "target": "target"},
        {"path": "d.tfrecord", "features": {"x": {"shape": [3]}, "y": {"shape": [1]}}, "target": "y"},
        {"factory": f"{SPECS / 'data_factories.py'}:dataset", "args": {"features": 3}},
    ]
    for source in sources:
        document = spec_dict("dense", steps=2, data={**source, "batch_size": 8})
        document["model"]["args"] = {"features": 3}
        report = trace(tmp_path, document)
        assert report.steps_run == 2 and report.run["input_shape"] == [3], source


def test_trace_file_and_json_report(tmp_path):
    report = trace(tmp_path, spec_dict("forward_nan", steps=3), keep_going=True)
    header, steps, others = read_trace(tmp_path / "trace.jsonl")
    assert len(steps) == 3 and header["layers"][1] == ["log", "LogOfInput"]
    assert others[-1]["kind"] == "summary"
    document = json.loads(json.dumps(report.to_json()))
    assert document["schema"] == "nanscope.trace/1" and document["status"] == "nonfinite"
    assert set(document["first_nonfinite"]) >= {"step", "phase", "layer", "variable", "op", "source"}
    assert {"step", "loss", "grad_global_norm"} <= set(document["steps"][0])
    assert document["steps"][0]["grad_global_norm"] == "nan"
    for rec in document["recommendations"]:
        assert set(rec) >= {"id", "title", "severity", "evidence", "fix"}


def test_the_run_header_has_one_field_order_and_rejects_unknown_or_missing_fields():
    from nanscope.report.header import REQUIRED_RUN_FIELDS, RUN_FIELDS, run_header

    fields = {name: name.upper() for name in REQUIRED_RUN_FIELDS}
    header = run_header(distribute={"replicas": 2}, **dict(reversed(list(fields.items()))))
    assert list(header) == [name for name in RUN_FIELDS if name in fields or name == "distribute"]
    with pytest.raises(TypeError, match="unknown fields \\['colour'\\]"):
        run_header(colour="red", **fields)
    with pytest.raises(TypeError, match="missing fields \\['seed'\\]"):
        run_header(**{k: v for k, v in fields.items() if k != "seed"})
