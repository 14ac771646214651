"""The step row's one schema: every producer's row decodes to the values a numpy/eager reference computes.

Each producer (the single compiled step, the chunked loop, the Keras callback's probe)
runs a real step on a batch whose every measured column has a distinct value (loss
and data loss differ by a regulariser, applied and raw gradient norms by a transform,
x and y non-finite counts by their number). A producer and a decoder that disagree on
where a column is put one of these values in the wrong field, and the test fails.
"""

import dataclasses

import numpy as np
import pytest

from nanscope.engine.records import StepRecord
from nanscope.engine.schema import (FLOAT16_TINY, LAYER, LAYER_STATISTICS, NOT_COUNTED, OUTPUT, SCALARS, VARIABLE,
                                     Columns, StepLayout, combined_layer_rows)
from nanscope.runtime import tensorflow
from nanscope.run.session import open_session
from nanscope.spec.load import parse_spec

tf, keras = tensorflow()
BATCH, FEATURES, L2 = 8, 4, 0.05

FACTORY = f"""
import numpy as np
import keras


def model():
    return keras.Sequential([
        keras.Input(({FEATURES},)),
        keras.layers.Dense(5, activation="tanh", kernel_regularizer=keras.regularizers.L2({L2}), name="hidden"),
        keras.layers.Dense(1, name="out"),
    ])


def data():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((32, {FEATURES})).astype("float32")
    return x, (x.sum(axis=1, keepdims=True) * 0.5).astype("float32")
"""


def test_columns_are_found_by_name_and_packed_in_order():
    columns = Columns("a", "b", "c")
    assert columns.at("c") == 2 and columns.pack({"c": 3, "a": 1, "b": 2}) == [1, 2, 3]
    assert columns.pack({"b": 2}, default=0) == [0, 2, 0]
    with pytest.raises(KeyError, match="no value for column"):
        columns.pack({"a": 1})
    with pytest.raises(KeyError, match="not columns: d"):
        columns.pack({"d": 1}, default=0)
    with pytest.raises(KeyError, match="no column 'd'"):
        columns.at("d")
    with pytest.raises(ValueError, match="unique"):
        Columns("a", "a")


def test_a_layout_splits_a_joined_row_back_into_its_parts():
    layout = StepLayout(outputs=2, layers=3, terms=4, variables=5)
    parts = [np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 100 * i
             for i, shape in enumerate(layout.shapes)]
    row = np.concatenate([p.ravel() for p in parts])
    assert layout.width == len(row) == len(SCALARS) + 2 * len(OUTPUT) + 3 * len(LAYER) + 4 + 5 * len(VARIABLE)
    for got, expected in zip(layout.split(np.stack([row, row])), parts):
        np.testing.assert_array_equal(got[1], expected)
    with pytest.raises(ValueError, match="columns"):
        layout.split(row[:-1])


def test_every_named_field_decodes_from_its_own_column():
    """Distinct values in every column: the decoder reads each field from the column of that name."""
    layout = StepLayout(outputs=2, layers=1, terms=2, variables=1)
    scalars = np.arange(1, layout.scalar_width + 1, dtype=np.float64)
    layer = np.array([LAYER.pack({"max_abs": 7.0, "sum_abs": 20.0, "nonfinite": 3, "zeros": 5, "size": 10,
                                  "tiny": 2})])
    variable = np.array([VARIABLE.pack({"grad_norm": 1.5, "grad_nonfinite": 4, "weight_norm": 2.0,
                                        "update_norm": 0.5, "weight_nonfinite": 6})])
    record = StepRecord.from_arrays(9, 16, scalars, layer, np.array([0.25, 0.75]), variable)
    for name in ("loss", "data_loss", "grad_global_norm", "applied_grad_global_norm", "x_nonfinite", "y_nonfinite",
                 "output_nonfinite", "grad_nonfinite", "weights_nonfinite", "loss_scale"):
        assert getattr(record, name) == SCALARS.at(name) + 1, name
    assert record.loss_nonfinite and record.update_skipped
    assert [(o.loss, o.target_nonfinite, o.prediction_nonfinite) for o in record.outputs] == [
        tuple(len(SCALARS) + i * len(OUTPUT) + OUTPUT.at(n) + 1 for n in OUTPUT) for i in range(2)]
    (stats,) = record.layers
    assert (stats.max_abs, stats.mean_abs, stats.nonfinite, stats.zero_fraction, stats.underflow_fraction,
            stats.loss_term) == (7.0, 2.0, 3, 0.5, 0.2, 0.25)
    assert record.model_loss_term == 0.75
    (var,) = record.variables
    assert (var.grad_norm, var.grad_nonfinite, var.weight_norm, var.update_ratio, var.weight_nonfinite) == (
        1.5, 4, 2.0, 0.25, 6)


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    folder = tmp_path_factory.mktemp("schema")
    (folder / "factory.py").write_text(FACTORY)
    spec = parse_spec({
        "model": {"factory": f"{folder / 'factory.py'}:model"},
        "data": {"factory": f"{folder / 'factory.py'}:data", "batch_size": BATCH, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.1}, "steps": 4, "seed": 0},
    }, source=str(folder / "spec.yaml"))
    return open_session(spec)


def _halved(grads):
    return [g * 0.5 for g in grads]


def reference(model, x, y):
    """Eager numpy references for one SGD step on (x, y): taken before the step, except the weights after it."""
    layers = [layer for layer in model.layers]
    outputs, h = [], tf.constant(x)
    with tf.GradientTape() as tape:
        for layer in layers:
            h = layer(h)
            outputs.append(h.numpy())
        data_loss = tf.reduce_mean(tf.square(h - y))
        penalty = tf.add_n(model.losses)
        loss = data_loss + penalty
    grads = [g.numpy() for g in tape.gradient(loss, model.trainable_variables)]
    return {
        "loss": float(loss), "data_loss": float(data_loss), "penalty": float(penalty),
        "grad_norms": [float(np.linalg.norm(g)) for g in grads],
        "grad_global_norm": float(np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in grads))),
        "max_abs": [float(np.abs(o).max()) for o in outputs],
        "mean_abs": [float(np.abs(o).mean()) for o in outputs],
    }


def check(record, ref, model, halved, terms_after_update=False, step=0):
    assert record.step == step  # the number of the step the producer ran, not one off
    assert record.loss == pytest.approx(ref["loss"], rel=1e-5)
    assert record.data_loss == pytest.approx(ref["data_loss"], rel=1e-2 if terms_after_update else 1e-5)
    assert record.layers[0].loss_term == pytest.approx(ref["penalty"], rel=0.1 if terms_after_update else 1e-5)
    assert record.grad_global_norm == pytest.approx(ref["grad_global_norm"], rel=1e-4)
    assert record.applied_grad_global_norm == pytest.approx(ref["grad_global_norm"] * (0.5 if halved else 1), rel=1e-4)
    assert [v.grad_norm for v in record.variables] == pytest.approx(ref["grad_norms"], rel=1e-4)
    after = [float(np.linalg.norm(v.numpy())) for v in model.trainable_variables]
    assert [v.weight_norm for v in record.variables] == pytest.approx(after, rel=1e-5)
    assert [s.max_abs for s in record.layers] == pytest.approx(ref["max_abs"], rel=1e-5)
    assert [s.mean_abs for s in record.layers] == pytest.approx(ref["mean_abs"], rel=1e-5)
    assert record.batch_rows == BATCH and record.finite


def test_the_single_step_and_the_chunked_loop_decode_to_the_reference(session):
    engine = session.instrumented_step(grad_transform=_halved)
    x, y = session.batch(0)
    session.reset_weights()
    ref = reference(session.model.keras_model, x, y)
    check(engine.run(0, x, y), ref, session.model.keras_model, halved=True)

    session.reset_weights()
    runner = session.chunk_runner(engine)
    (record,) = runner.run(0, [session.order.indices(0)], stop_on_nonfinite=True)
    check(record, ref, session.model.keras_model, halved=True)


def test_the_chunked_loop_numbers_its_steps_from_the_first_it_was_given(session):
    engine = session.instrumented_step()
    session.reset_weights()
    chunked = session.chunk_runner(engine).run(1, [session.order.indices(s) for s in (1, 2, 3)],
                                               stop_on_nonfinite=True)
    session.reset_weights()
    single = [engine.run(s, *session.batch(s)) for s in (1, 2, 3)]
    assert [r.step for r in chunked] == [r.step for r in single] == [1, 2, 3]
    assert [r.loss for r in chunked] == pytest.approx([r.loss for r in single], rel=1e-6)


def test_nonfinite_counts_land_in_their_own_columns(session):
    engine = session.instrumented_step()
    x, y = session.batch(1)
    x, y = x.copy(), y.copy()
    x[0, :3] = np.nan
    y[1:3, 0] = np.inf
    session.reset_weights()
    record = engine.run(1, x, y)
    assert (record.x_nonfinite, record.y_nonfinite) == (3, 2)
    assert record.output_nonfinite == 1  # the one prediction of the row with NaN features
    assert record.loss_nonfinite and record.phase == "data"


def test_the_keras_callback_decodes_to_the_reference(session, tmp_path):
    from nanscope.keras import NanScope

    model = session.model.keras_model
    session.reset_weights()
    x, y = session.batch(0)
    ref = reference(model, x, y)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    scope = NanScope(verbose=0, trace=tmp_path / "trace.jsonl")
    model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, callbacks=[scope], verbose=0)
    (record,) = scope.report.records
    # The callback measures the layers' loss terms after the update (this SGD step moves the
    # penalty by ~6%), and data_loss = loss - terms by ~0.5%; loss and data_loss differ by ~8%.
    check(record, ref, model, halved=False, terms_after_update=True)


def test_the_history_row_puts_every_value_in_the_column_of_its_name():
    """Distinct values in every field of a record: a history row that swapped two columns fails here."""
    from nanscope.engine.records import OutputStats, VariableStats
    from nanscope.engine.schema import PHASES
    from nanscope.store.rows import scalar_row, series_columns

    record = StepRecord(step=3, batch_rows=8, loss=1.5, data_loss=2.5, grad_global_norm=3.5,
                        applied_grad_global_norm=4.5, x_nonfinite=5, y_nonfinite=6, output_nonfinite=7,
                        loss_nonfinite=False, grad_nonfinite=9, weights_nonfinite=10, loss_scale=11.0,
                        update_skipped=True, loss_scale_before=22.0,
                        variables=[VariableStats(grad_norm=1.0, grad_nonfinite=0, weight_norm=3.0, update_ratio=0.5,
                                                 weight_nonfinite=0)],
                        outputs=[OutputStats(12.5, 13, 14), OutputStats(15.5, 16, 17)])
    row = series_columns(2).named(scalar_row(record))
    expected = {name: float(getattr(record, name)) for name in SCALARS}
    expected.update({"batch_rows": 8, "phase": PHASES.index(record.phase), "weight_norm": 3.0, "update_ratio": 0.5})
    for index, output in enumerate(record.outputs):
        expected.update({f"output{index}/{name}": getattr(output, name) for name in OUTPUT})
    assert row == expected
    # Every value but the flags' distinct, so any two swapped columns fail the comparison above;
    # each flag set alone must land in its own column.
    flags = ("loss_nonfinite", "update_skipped", "loss_missing")
    numbers = [value for name, value in row.items() if name not in flags]
    assert len(set(numbers)) == len(numbers)
    for flag in flags:
        alone = dataclasses.replace(record, **{name: name == flag for name in flags})
        row = series_columns(2).named(scalar_row(alone))
        assert {name: row[name] for name in flags} == {name: float(name == flag) for name in flags}


def test_each_layer_statistic_s_reference_on_known_values():
    """The numpy references the probes are held to (tests/test_perf_exact.py), on values whose statistics are known:
    |x| of the finite entries, non-finite and zero entries, and one float16 subnormal (1e-6 < 6.1e-5)."""
    values = np.array([0.0, -3.0, 1e-6, np.nan, np.inf, 2.0, FLOAT16_TINY])  # the smallest normal is no underflow
    assert [s.name for s in LAYER_STATISTICS] == list(LAYER)
    assert [s.expected(values, True) for s in LAYER_STATISTICS] == [3.0, 5.000001 + FLOAT16_TINY, 2.0, 1.0, 7.0, 1.0]
    assert [s.expected(values, False) for s in LAYER_STATISTICS] == [3.0, 5.000001 + FLOAT16_TINY, 2.0, 1.0, 7.0, 0.0]
    assert [s.expected(np.array([np.nan]), True) for s in LAYER_STATISTICS] == [0.0, 0.0, 1.0, 0.0, 1.0, 0.0]


def test_layer_rows_combine_as_each_statistic_declares():
    """max_abs by its maximum, zeros a sum unless a part did not count them, the rest summed."""
    first, second = [3.0, 5.0, 2.0, 1.0, 6.0, 1.0], [4.0, 1.0, 0.0, 2.0, 2.0, 0.0]
    assert combined_layer_rows([first, second]).tolist() == [4.0, 6.0, 2.0, 3.0, 8.0, 1.0]
    second[LAYER.at("zeros")] = NOT_COUNTED
    assert combined_layer_rows([first, second]).tolist() == [4.0, 6.0, 2.0, NOT_COUNTED, 8.0, 1.0]
    # A count of 0 is counted: 0 zeros and 1 zero make 1.
    none = [1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    assert combined_layer_rows([none, [1.0, 1.0, 0.0, 1.0, 1.0, 0.0]]).tolist() == [1.0, 2.0, 0.0, 1.0, 2.0, 0.0]
    # Replicas' rows of two layers, [replicas, layers, columns]: each layer combined on its own, and a layer whose
    # zeros one replica did not count leaves the other layer's count alone.
    assert combined_layer_rows([[first, none], [first, second]]).tolist() == [
        [3.0, 10.0, 4.0, 2.0, 12.0, 2.0], [4.0, 2.0, 0.0, NOT_COUNTED, 3.0, 0.0]]

