"""nanscope.keras.NanScope: the same per-step records inside model.fit, stop at NaN, model left as found."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
ROWS, BATCH = 128, 16


def regression_data(scale=1.0):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1)) * scale).astype(np.float32)
    return x, y


def mlp(lr=0.01, **compile_args):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse", **compile_args)
    return model


class BatchLosses(keras.callbacks.Callback):
    """fit's own per-batch logs: the running mean of the loss over the epoch."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


def quiet(**kwargs):
    return NanScope(console=Console(file=open(os.devnull, "w")), **kwargs)


def test_records_the_loss_fit_logs_and_leaves_the_model_as_found():
    model = mlp()
    x, y = regression_data()
    model.make_train_function()
    original_function = model.train_function
    scope, seen = quiet(), BatchLosses()
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, callbacks=[scope, seen], verbose=0)

    report = scope.report
    steps_per_epoch = ROWS // BATCH
    assert [r.step for r in report.records] == list(range(2 * steps_per_epoch))
    losses = np.array([r.loss for r in report.records]).reshape(2, steps_per_epoch)
    running = np.cumsum(losses, axis=1) / np.arange(1, steps_per_epoch + 1)  # equal batches: fit's running mean
    np.testing.assert_allclose(running.ravel(), seen.losses, rtol=1e-5)
    assert all(r.grad_global_norm > 0 and r.phase is None for r in report.records)
    names = [layer.name for layer in model.layers]  # Keras numbers layer names per process
    assert [name for name, _ in report.layers] == names
    assert report.layer_order == names
    assert report.records[0].layers[1].mean_abs > 0 and report.variables == [
        f"{names[0]}/kernel", f"{names[0]}/bias", f"{names[1]}/kernel", f"{names[1]}/bias"]
    assert report.first_nonfinite is None and report.status != "nonfinite"
    assert "train_step" not in model.__dict__ and model.train_function is original_function
    assert "compute_loss" not in model.__dict__ and "apply" not in model.optimizer.__dict__
    assert "call" not in model.layers[0].__dict__


def test_stops_at_the_first_nonfinite_step_and_writes_the_json(tmp_path):
    model = mlp(lr=0.05)
    x, y = regression_data(scale=1000.0)
    path = tmp_path / "nanscope.json"
    history = model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0,
                        callbacks=[quiet(report=path)])

    document = json.loads(path.read_text())
    first = document["first_nonfinite"]
    assert document["schema"] == "nanscope.trace/1" and document["status"] == "nonfinite"
    assert first["phase"] in ("loss", "backward") and document["steps_run"] == first["step"] + 1
    assert document["steps"][-1]["phase"] == first["phase"]
    assert len(history.history["loss"]) == first["step"] // (ROWS // BATCH) + 1  # stopped in that epoch
    assert document["recommendations"], "an exploding run gets recommendations"
    assert "train_step" not in model.__dict__


def test_keep_going_records_every_step():
    model = mlp(lr=0.05)
    x, y = regression_data(scale=1000.0)
    scope = quiet(stop_on_nonfinite=False)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[scope])
    assert scope.report.steps_run == 2 * ROWS // BATCH
    # Targets x1000 at lr 0.05: the loss overflows at step 3 (as the run that stops there finds), and the run goes on.
    first = scope.report.first_nonfinite
    assert (first.step, first.phase) == (3, "loss")
    assert [r.phase for r in scope.report.records[:5]] == [None, None, None, "loss", "forward"]


@pytest.mark.parametrize("jit_compile", [False, True])
def test_steps_per_execution_records_every_step(jit_compile):
    x, y = regression_data()
    runs = []
    for per_execution in (1, 2):
        model = mlp(steps_per_execution=per_execution, jit_compile=jit_compile)
        scope = quiet()
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
        runs.append(scope.report)
    single, double = runs
    assert [r.step for r in double.records] == list(range(ROWS // BATCH))
    np.testing.assert_allclose([r.loss for r in double.records], [r.loss for r in single.records], rtol=1e-5)
    np.testing.assert_allclose([r.layers[0].max_abs for r in double.records],
                               [r.layers[0].max_abs for r in single.records], rtol=1e-5)
    assert double.run["jit_compile"] is jit_compile


class MaskScores(keras.layers.Layer):
    """Sets the upper half of each row to -inf, like an attention mask."""

    def call(self, x):
        keep = tf.range(tf.shape(x)[-1]) < tf.shape(x)[-1] // 2
        return tf.where(keep, x, tf.fill(tf.shape(x), -np.inf))


class TimesZero(keras.layers.Layer):
    """-inf * 0 = NaN: a layer downstream of the mask that does turn it into a problem."""

    def call(self, x):
        return x * 0.0


def masked_classifier(downstream=None):
    keras.utils.set_random_seed(0)
    layers = [keras.Input((8,)), keras.layers.Dense(6, name="scores"), MaskScores(name="mask")]
    layers += [downstream] if downstream is not None else []
    model = keras.Sequential([*layers, keras.layers.Softmax(name="attention"), keras.layers.Dense(3, name="head")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="sparse_categorical_crossentropy")
    return model


def class_data():
    x = np.random.default_rng(1).standard_normal((64, 8)).astype(np.float32)
    return x, (np.arange(64) % 3).astype(np.int32)


def test_expected_infinities_are_reported_but_not_counted():
    x, y = class_data()
    unexpected = quiet()
    masked_classifier().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[unexpected])
    first = unexpected.report.first_nonfinite
    assert (first.step, first.phase, first.layer) == (0, "forward", "mask")

    expected = quiet(expect_nonfinite=["mask"])
    masked_classifier().fit(x, y, batch_size=BATCH, epochs=1, verbose=0, callbacks=[expected])
    report = expected.report
    assert report.first_nonfinite is None and report.steps_run == 64 // BATCH
    mask = [name for name, _ in report.layers].index("mask")
    assert all(r.layers[mask].nonfinite == BATCH * 3 for r in report.records)  # reported ...
    assert any("mask" in note and "expected" in note for note in report.notes)  # ... and said so


def test_a_layer_that_turns_expected_infinities_into_nan_still_counts():
    x, y = class_data()
    scope = quiet(expect_nonfinite=["ma*"])
    masked_classifier(downstream=TimesZero(name="zeroed")).fit(x, y, batch_size=BATCH, epochs=1, verbose=0,
                                                               callbacks=[scope])
    first = scope.report.first_nonfinite
    assert (first.step, first.phase, first.layer) == (0, "forward", "zeroed")


def test_trace_steps_honours_train_expect_nonfinite(tmp_path):
    factory = tmp_path / "masked.py"
    factory.write_text(
        "import numpy as np\nfrom tests.test_keras_callback import masked_classifier, class_data\n"
        "def build():\n    return masked_classifier()\n"
        "def data():\n    return class_data()\n"
    )
    document = {
        "model": {"factory": f"{factory}:build"},
        "data": {"factory": f"{factory}:data", "batch_size": BATCH, "shuffle": False},
        "train": {"steps": 3, "seed": 0, "expect_nonfinite": ["mask"]},
    }
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    report = run_trace(spec, TraceOptions(trace_path=tmp_path / "trace.jsonl", forensics=False))
    assert report.first_nonfinite is None and report.steps_run == 3
    assert report.records[0].layers[[n for n, _ in report.layers].index("mask")].nonfinite > 0
