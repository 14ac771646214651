"""`NanScope(repro=DIR)`: the bundle of a fit's first non-finite step, `nanscope replay DIR` and `--verify` on it."""

import json
import logging
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"
sys.path.insert(0, str(SPECS))
import fit_bundle  # noqa: E402  (the user's own loss and models, in a file)

ROWS, BATCH = 64, 16


def data(bad_rows=()):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 8)).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1))).astype(np.float32)
    x[list(bad_rows)] = np.nan
    return x, y


def dense(loss):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
    return model


def fit(model, bundle, bad_rows=(), **kwargs):
    x, y = data(bad_rows)
    scope = NanScope(verbose=0, repro=bundle, **kwargs)
    keras.utils.set_random_seed(0)
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0, callbacks=[scope])
    return scope


def replay(bundle, *options):
    return CliRunner().invoke(app, ["replay", str(bundle), *options])


def tagged_line(tag):
    lines = (SPECS / "fit_bundle.py").read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if f"# {tag}" in line)


def test_the_bundle_holds_the_state_before_the_step_and_replays_the_sqrt_in_the_loss_file(tmp_path):
    model = dense(fit_bundle.root_loss)
    kernel_before = model.get_layer("out").kernel.numpy()
    bundle = tmp_path / "nan-step"
    scope = fit(model, bundle)
    assert any(note.startswith(f"repro: step 0 (epoch 0) saved to {bundle}") for note in scope.report.notes)
    assert sorted(p.name for p in bundle.iterdir()) == ["code", "model.keras", "repro.json", "state.npz"]
    document = json.loads((bundle / "repro.json").read_text())
    assert (document["kind"], document["step"], document["epoch"]) == ("fit", 0, 0)
    assert [entry["qualname"] for entry in document["user_code"]] == ["root_loss"]
    assert (document["user_code"][0]["file"], document["user_code"][0]["origin"]) == (
        "code/fit_bundle.py", "tests/specs/fit_bundle.py" if Path.cwd() == SPECS.parent.parent else "fit_bundle.py")
    assert (bundle / "code" / "fit_bundle.py").read_bytes() == (SPECS / "fit_bundle.py").read_bytes()
    with np.load(bundle / "state.npz") as arrays:
        np.testing.assert_array_equal(arrays["state_0"], kernel_before)  # before the step, not after
        np.testing.assert_array_equal(arrays["batch_0"], data()[0][:BATCH])

    result = replay(bundle)
    assert result.exit_code == 1, result.output
    assert "Sqrt" in result.stdout and f"fit_bundle.py:{tagged_line('producer: sqrt')}" in result.stdout

    result = replay(bundle, "--json", "-")
    document = json.loads(result.stdout)
    first = document["first_nonfinite"]
    assert (document["schema"], first["step"], first["phase"], first["op"]) == ("nanscope.replay/1", 0, "loss", "Sqrt")
    assert first["source"].endswith(f"fit_bundle.py:{tagged_line('producer: sqrt')}")
    assert first["inputs"]["negative_fraction"] > 0
    assert document["recommendations"][0]["id"] == "safe-sqrt"


@pytest.mark.parametrize(("loss", "helped"), [("mse", True), (fit_bundle.root_loss, False)])
def test_verify_drops_the_nonfinite_rows_and_says_whether_the_step_then_stays_finite(tmp_path, loss, helped):
    bundle = tmp_path / "nan-rows"
    fit(dense(loss), bundle, bad_rows=(3, 5))
    result = replay(bundle, "--verify", "--json", "-")
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert document["first_nonfinite"]["phase"] == "data"
    rec = next(r for r in document["recommendations"] if r["id"] == "clean-input-data")
    (row,) = rec["verification"]
    assert row["fix"] == "drop 2 non-finite rows" and row["params"]["dropped_rows"] == [3, 5]
    assert (rec["verified"], row["helped"], row["finite"], row["steps_run"]) == (helped, helped, helped, 1)
    if helped:  # the loss on the 14 finite rows, from the weights before the step, as Keras computes it
        model, (x, y) = dense("mse"), data()
        kept = [i for i in range(BATCH) if i not in (3, 5)]
        expected = float(keras.losses.MeanSquaredError()(y[kept], model(x[kept])))
        assert row["loss"] == pytest.approx(expected, rel=1e-5)
        assert np.isfinite(row["final_loss"])
    else:
        assert (row["nonfinite_phase"], row["nonfinite_op"]) == ("loss", "Sqrt")
    assert any("one step" in note for note in document["notes"])


def test_a_subclassed_model_in_a_file_replays_from_its_bundle(tmp_path):
    keras.utils.set_random_seed(0)
    model = fit_bundle.TwoLayer()  # not built when fit starts
    model.compile(optimizer="adam", loss=fit_bundle.root_loss)
    bundle = tmp_path / "sub"
    fit(model, bundle)
    document = json.loads((bundle / "repro.json").read_text())
    assert sorted(entry["qualname"] for entry in document["user_code"]) == ["TwoLayer", "root_loss"]
    result = replay(bundle, "--json", "-")
    assert result.exit_code == 1, result.output
    first = json.loads(result.stdout)["first_nonfinite"]
    assert (first["phase"], first["op"]) == ("loss", "Sqrt")
    assert first["source"].endswith(f"fit_bundle.py:{tagged_line('producer: sqrt')}")


@pytest.mark.parametrize(("kind", "why"), [("no get_config", "NotImplementedError"),
                                         ("lambda loss", "BundleError: test_a_model_keras_cannot_save")])
def test_a_model_keras_cannot_save_leaves_fit_running_and_no_folder(tmp_path, caplog, kind, why):
    keras.utils.set_random_seed(0)
    if kind == "no get_config":
        model = fit_bundle.Unsaveable(1)
        model.compile(optimizer="sgd", loss=fit_bundle.root_loss)
    else:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss=lambda y, p: tf.reduce_mean(tf.sqrt(p - y)))
    with caplog.at_level(logging.WARNING, logger="nanscope"):
        scope = fit(model, tmp_path / "bundle", stop_on_nonfinite=False)
    assert scope.report.steps_run == 2 * ROWS // BATCH  # fit ran to its end, recording every step
    assert scope.report.first_nonfinite.op == "Sqrt"
    warnings = [r.getMessage() for r in caplog.records if r.name == "nanscope"]
    assert len(warnings) == 1 and "repro bundle" in warnings[0] and "\n" not in warnings[0]
    assert any(note.startswith(f"repro: no bundle written to {tmp_path / 'bundle'}: {why}")
               for note in scope.report.notes)
    assert list(tmp_path.iterdir()) == []  # nothing half-written left behind


def test_a_corrupt_bundle_or_a_missing_user_file_is_bad_input(tmp_path):
    bundle = tmp_path / "b"
    fit(dense(fit_bundle.root_loss), bundle)
    meta = bundle / "repro.json"
    document = json.loads(meta.read_text())
    meta.write_text(json.dumps({**document, "user_code": [{**document["user_code"][0], "file": "/gone/losses.py"}]}))
    result = replay(bundle)
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "user_code[0].file: file not found: /gone/losses.py" in result.stderr
    meta.write_text(json.dumps({**document, "variables": document["variables"][:1]}))
    result = replay(bundle)
    assert result.exit_code == 2 and "`variables`" in result.stderr and "Traceback" not in result.output
    meta.write_text("{")
    result = replay(bundle)
    assert result.exit_code == 2 and f"{meta}: cannot read" in result.stderr


def test_repro_needs_forensics():
    with pytest.raises(ValueError, match="`repro` needs"):
        NanScope(repro="dir", forensics=False)


def test_fixes_to_the_update_are_not_judged_on_a_step_whose_weights_already_overflow(tmp_path):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((ROWS, 8)) * 3).astype(np.float32)
    y = (x @ rng.standard_normal((8, 1))).astype(np.float32)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(1.0), loss="mse")  # diverges within a few steps
    bundle = tmp_path / "diverged"
    scope = NanScope(verbose=0, repro=bundle)
    model.fit(x, y, batch_size=BATCH, epochs=5, shuffle=False, verbose=0, callbacks=[scope])
    first = scope.report.first_nonfinite
    # SGD(1.0) multiplies the loss ~10^4-10^15 a step: 100.6, 2.0e6, 8.1e21, and step 3's squared error
    # overflows float32 (3.4e38): the loss phase of step 3, after three finite updates.
    assert (first.step, first.phase) == (3, "loss")
    assert "lower-learning-rate" in [rec.id for rec in scope.report.recommendations]

    document = json.loads(replay(bundle, "--verify", "--json", "-").stdout)
    assert (document["first_nonfinite"]["step"], document["first_nonfinite"]["op"]) == (first.step, "Square")
    rec = next(r for r in document["recommendations"] if r["id"] == "lower-learning-rate")
    assert "from the fit run's report" in rec["evidence"][-1]
    assert (rec["verified"], rec["verification"]) == (None, [])  # undecided, not a false "no"
    assert any(note.startswith("--verify: lr/10, lr/100 (lower-learning-rate) not tried") for note in document["notes"])


def test_a_mixed_float16_bundle_loads_with_its_loss_scale_optimizer(tmp_path):
    x, y = data()
    x[2 * BATCH + 3] *= 40.0  # a row of step 2 drives exp past float16's range
    keras.utils.set_random_seed(0)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4, name="proj"), fit_bundle.Exp(name="exp"),
                                  keras.layers.Dense(1, name="out", dtype="float32")])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    model.compile(optimizer=keras.optimizers.SGD(1e-4), loss="mse")
    bundle = tmp_path / "mixed"
    scope = NanScope(verbose=0, repro=bundle)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    assert scope.report.first_nonfinite.step == 2
    document = json.loads(replay(bundle, "--json", "-").stdout)
    first = document["first_nonfinite"]
    assert (first["step"], first["phase"], first["layer"], first["op"]) == (2, "forward", "exp", "Exp")
    assert first["inputs"]["dtype"] == "float16"
    assert first["source"].endswith(f"fit_bundle.py:{tagged_line('producer: exp')}")
    assert document["run"]["loss_scaling"] is True and keras.config.dtype_policy().name == "float32"


def test_verify_raises_the_epsilon_of_an_update_that_divides_by_zero(tmp_path):
    x, y = data()
    x[:, 0] = 0.0  # the kernel row of feature 0 gets a zero gradient: Adam's update is 0 / (0 + epsilon)
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(epsilon=0.0), loss="mse")
    bundle = tmp_path / "eps"
    scope = NanScope(verbose=0, repro=bundle)
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    assert (scope.report.first_nonfinite.step, scope.report.first_nonfinite.phase) == (0, "update")
    result = replay(bundle, "--verify")
    assert result.exit_code == 1 and "epsilon=0.0001" in result.stdout and "step finite" in result.stdout
    document = json.loads(replay(bundle, "--verify", "--json", "-").stdout)
    assert (document["first_nonfinite"]["phase"], document["first_nonfinite"]["op"]) == ("update", "RealDiv")
    rec = document["recommendations"][0]
    (row,) = rec["verification"]
    assert (rec["id"], rec["verified"], row["fix"], row["finite"]) == ("optimizer-epsilon", True, "epsilon=0.0001",
                                                                        True)
    assert row["final_loss"] < row["loss"]  # the fixed update moved the weights downhill on this batch


GAIN_LAYERS = """\
import keras
import tensorflow as tf

from gain_helpers import soft_root


class PerFeatureGain(keras.layers.Layer):
    \"\"\"A learned gain per feature, then a square root (NaN for a negative input).\"\"\"

    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gain")

    def call(self, x):
        return soft_root(x) * self.gain
"""
GAIN_HELPERS = """\
import tensorflow as tf


def soft_root(x):
    return tf.sqrt(x)  # producer: sqrt
"""


def gain_project(folder):
    """The user's project: a custom layer with `build()` in one file, the op it calls in a file it imports."""
    folder.mkdir()
    (folder / "gain_layers.py").write_text(GAIN_LAYERS)
    (folder / "gain_helpers.py").write_text(GAIN_HELPERS)
    sys.path.insert(0, str(folder))
    try:
        import gain_layers
    finally:
        sys.path.remove(str(folder))
    return gain_layers


def forget_project(folder):
    """The user's files are gone, and this process forgets it imported them: only the bundle can hold them now."""
    for name in ("gain_layers", "gain_helpers"):
        sys.modules.pop(name, None)
    shutil.rmtree(folder)


def test_a_fit_bundle_replays_from_a_copy_of_its_folder_once_the_users_files_are_gone(tmp_path):
    gain_layers = gain_project(tmp_path / "project")
    x, y = data()
    x = np.abs(x)
    x[2 * BATCH + 5, 3] = -1.0  # a row of step 2 takes the square root of a negative number
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), gain_layers.PerFeatureGain(name="gain"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    scope = NanScope(verbose=0, repro=tmp_path / "bundle")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    first = scope.report.first_nonfinite
    assert (first.step, first.phase, first.layer, first.op) == (2, "forward", "gain", "Sqrt")
    document = json.loads((tmp_path / "bundle" / "repro.json").read_text())
    assert [(e["qualname"], e["file"], e["origin"]) for e in document["user_code"]] == [
        ("PerFeatureGain", "code/gain_layers.py", "gain_layers.py")]
    assert sorted(p.name for p in (tmp_path / "bundle" / "code").iterdir()) == ["gain_helpers.py", "gain_layers.py"]

    moved = shutil.copytree(tmp_path / "bundle", tmp_path / "elsewhere" / "nan-step")
    shutil.rmtree(tmp_path / "bundle")
    forget_project(tmp_path / "project")
    result = replay(moved, "--json", "-")
    assert result.exit_code == 1, result.output
    replayed = json.loads(result.stdout)["first_nonfinite"]
    line = GAIN_HELPERS.splitlines().index("    return tf.sqrt(x)  # producer: sqrt") + 1
    assert (replayed["step"], replayed["phase"], replayed["layer"], replayed["op"]) == (2, "forward", "gain", "Sqrt")
    assert replayed["source"] == f"gain_helpers.py:{line}"
    assert "gain_helpers.py ran from the bundle's copy code/gain_helpers.py (the same lines)" in replayed["detail"]
    assert str(tmp_path / "project") not in (moved / "repro.json").read_text()


def test_a_bundle_whose_model_has_a_lambda_layer_replays_only_with_unsafe(tmp_path):
    x, y = data()
    x[BATCH + 2, 0] = -4.0  # step 1 takes the square root of a negative number
    keras.utils.set_random_seed(0)
    # Keras loads a lambda's bytecode with its own module's globals: the body names what it uses itself.
    root = keras.layers.Lambda(lambda t: __import__("keras").ops.sqrt(t), name="root")
    model = keras.Sequential([keras.Input((8,)), root, keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    bundle = tmp_path / "lambda"
    scope = NanScope(verbose=0, repro=bundle)
    model.fit(np.abs(x) * np.where(x == -4.0, -1, 1), y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0,
              callbacks=[scope])
    assert (scope.report.first_nonfinite.step, scope.report.first_nonfinite.layer) == (1, "root")
    result = replay(bundle)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "needs unsafe deserialization (a Lambda layer" in result.stderr and "--unsafe" in result.stderr
    result = replay(bundle, "--unsafe", "--json", "-")
    assert result.exit_code == 1, (result.stdout, result.stderr)
    first = json.loads(result.stdout)["first_nonfinite"]
    assert (first["step"], first["phase"], first["layer"], first["op"]) == (1, "forward", "root", "Sqrt")


def test_a_lambda_whose_body_names_a_module_it_does_not_import_is_bad_input_with_a_hint(tmp_path):
    x, y = data()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Lambda(lambda t: tf.sqrt(t), name="root"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    scope = NanScope(verbose=0, repro=tmp_path / "lambda")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])  # sqrt(-x): NaN
    result = replay(tmp_path / "lambda", "--unsafe")
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.output
    assert "the saved step does not run from the bundle: NameError: name 'tf' is not defined" in result.stderr
    assert "import them inside it" in result.stderr
