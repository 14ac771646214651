"""TensorBoard output: event files readable with TensorFlow alone, with the expected tags and values."""

import io
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
from rich.console import Console

from nanscope.keras import NanScope
from nanscope.runtime import tensorflow
from nanscope.spec.load import load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
CONFIGS = Path(__file__).parent.parent / "configs"


def read_scalars(logdir):
    """{tag: {step: value}} from every event file under logdir, parsed without the tensorboard package."""
    scalars = {}
    for path in Path(logdir).glob("events.out.tfevents.*"):
        for raw in tf.data.TFRecordDataset(str(path)):
            event = tf.compat.v1.Event.FromString(raw.numpy())
            for value in event.summary.value:
                assert value.metadata.plugin_data.plugin_name == "scalars"
                scalars.setdefault(value.tag, {})[event.step] = float(tf.make_ndarray(value.tensor))
    return scalars


def test_trace_steps_writes_per_step_scalars(tmp_path):
    report = run_trace(load_spec(CONFIGS / "exploding-regression.yaml"),
                       TraceOptions(trace_path=tmp_path / "trace.jsonl", tensorboard=tmp_path / "tb", forensics=False))
    scalars = read_scalars(tmp_path / "tb")
    layer, variable = report.layers[0][0], report.variables[0]  # names depend on the models built before
    for tag in ("loss", "grad_global_norm", "nonfinite/grad", "nonfinite/output", f"layers/{layer}/max_abs",
                f"layers/{layer}/mean_abs", f"variables/{variable}/grad_norm"):
        assert sorted(scalars[tag]) == [r.step for r in report.records], tag
    for record in report.records:
        assert np.isclose(scalars["loss"][record.step], record.loss, rtol=1e-6, equal_nan=True)
        assert scalars["nonfinite/grad"][record.step] == record.grad_nonfinite
    last = report.records[-1]
    assert not np.isfinite(scalars["loss"][last.step])  # the non-finite step is written as it is


def test_a_multi_output_run_writes_each_output_loss(tmp_path):
    report = run_trace(load_spec(CONFIGS / "multi-output.yaml"),
                       TraceOptions(trace_path=tmp_path / "trace.jsonl", tensorboard=tmp_path / "tb", forensics=False))
    scalars = read_scalars(tmp_path / "tb")
    for index, name in enumerate(("price", "kind")):
        assert sorted(scalars[f"outputs/{name}/loss"]) == [r.step for r in report.records]
        for record in report.records:
            assert np.isclose(scalars[f"outputs/{name}/loss"][record.step], record.outputs[index].loss, rtol=1e-6,
                              equal_nan=True)


def test_callback_writes_the_same_tags(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, name="hidden"),
                              keras.layers.Dense(1, name="out")])
    model.compile(optimizer="sgd", loss="mse")
    x = np.random.default_rng(0).standard_normal((32, 4)).astype(np.float32)
    scope = NanScope(tensorboard=tmp_path / "tb", console=Console(file=io.StringIO()))
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[scope])
    scalars = read_scalars(tmp_path / "tb")
    assert sorted(scalars["loss"]) == [0, 1, 2, 3]
    assert scalars["layers/out/max_abs"][2] == scope.report.records[2].layers[1].max_abs
    assert "variables/hidden/kernel/update_ratio" in scalars
