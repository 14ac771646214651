"""What the `NanScope` callback tells from inside `fit`, as trace-steps tells it from a spec: the data-scale rules
on the targets the step trains on."""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
ROWS, BATCH = 256, 32


def prices():
    """House prices in whole dollars, as a CSV read with pandas gives them: int64."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((ROWS, 6)).astype(np.float32)
    y = np.round(250_000 + 80_000 * (x @ rng.standard_normal((6, 1)))).astype(np.int64)
    return x, y


def regression():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse")
    return model


@pytest.mark.parametrize("dtype", [np.int64, np.float32])
def test_raw_dollar_targets_get_normalize_targets_from_the_callback_as_from_trace_steps(tmp_path, dtype):
    x, y = prices()
    scope = NanScope(verbose=0)
    history = regression().fit(x, y.astype(dtype), batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
                               callbacks=[scope])
    assert history.history["loss"][-1] > 1e10  # stuck at the targets' scale squared
    found = {rec.id: rec for rec in scope.report.recommendations}
    assert "normalize-targets" in found, [rec.id for rec in scope.report.recommendations]
    assert found["normalize-targets"].data["y_std"] == pytest.approx(float(y.astype(np.float64).std()), rel=1e-4)

    np.savez(tmp_path / "prices.npz", x=x, y=y.astype(dtype))
    (tmp_path / "run.yaml").write_text(f"model: {{factory: {__file__}:regression}}\n"
                                       "data: {path: prices.npz, batch_size: 32, shuffle: false}\n"
                                       "train: {loss: mse, optimizer: {name: adam}, steps: 16, seed: 0}\n")
    result = CliRunner().invoke(app, ["trace-steps", str(tmp_path / "run.yaml"), "--json", "-",
                                      "--trace", str(tmp_path / "t.jsonl")])
    traced = {r["id"]: r for r in json.loads(result.stdout)["recommendations"]}
    assert traced["normalize-targets"]["severity"] == found["normalize-targets"].severity == "info"
    assert traced["normalize-targets"]["data"]["y_std"] == pytest.approx(found["normalize-targets"].data["y_std"],
                                                                          rel=1e-4)


def test_a_multi_output_models_dollar_target_is_judged_under_its_own_outputs_loss():
    """Price (mse) and kind (a class, sparse cross-entropy): the compiled loss is no single name, each target has
    its own; the price's scale is normalize-targets' finding for output 'price', the class labels are not."""
    x, y = prices()
    kind = (x[:, 0] > 0).astype(np.int64)
    keras.utils.set_random_seed(0)
    inputs = keras.Input((6,))
    hidden = keras.layers.Dense(16, activation="relu")(inputs)
    model = keras.Model(inputs, {"price": keras.layers.Dense(1, name="price")(hidden),
                                 "kind": keras.layers.Dense(2, name="kind")(hidden)})
    model.compile(optimizer=keras.optimizers.Adam(1e-3),
                  loss={"price": "mse", "kind": keras.losses.SparseCategoricalCrossentropy(from_logits=True)})
    scope = NanScope(verbose=0)
    model.fit(x, {"price": y, "kind": kind}, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=[scope])
    found = [rec for rec in scope.report.recommendations if rec.id == "normalize-targets"]
    assert [(rec.data["output"], rec.severity) for rec in found] == [("price", "info")]
    assert found[0].data["y_std"] == pytest.approx(float(y.astype(np.float64).std()), rel=1e-4)
