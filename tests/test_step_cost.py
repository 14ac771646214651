"""The instrumented step's cheaper paths against numpy: the optimizer's own update, the softmax probe."""

import numpy as np
import pytest

from nanscope.engine.variable_stats import applied_updates, graph_position
from nanscope.engine.probes import LayerRecorder
from nanscope.engine.step import InstrumentedStep
from nanscope.model.models import from_keras
from nanscope.run.losses import Loss
from nanscope.runtime import tensorflow

tf, keras = tensorflow()

INPUTS, HIDDEN, CLASSES, ROWS = 300, 250, 7, 32


def classifier(constraint=None):
    keras.utils.set_random_seed(3)
    return keras.Sequential([
        keras.Input((INPUTS,)),
        keras.layers.Dense(HIDDEN, activation="relu", kernel_constraint=constraint),
        keras.layers.Dense(CLASSES, activation="softmax"),
    ])


def batch(seed=0, spread=1.0):
    rng = np.random.default_rng(seed)
    x = (spread * rng.standard_normal((ROWS, INPUTS))).astype(np.float32)
    return x, rng.integers(0, CLASSES, ROWS).astype(np.int32)


def instrumented(model, optimizer):
    x, y = batch()
    loss = Loss(keras.losses.SparseCategoricalCrossentropy(), "scce")
    return InstrumentedStep(from_keras(model, "classifier"), loss, optimizer, x, y)


OPTIMIZERS = {
    "adam": lambda: keras.optimizers.Adam(0.01),
    "adamw": lambda: keras.optimizers.AdamW(0.01, weight_decay=0.1),  # two writes per kernel
    "sgd-nesterov": lambda: keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True),
    "rmsprop": lambda: keras.optimizers.RMSprop(0.01),
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_update_ratio_is_the_change_of_the_weights(name):
    model = classifier()
    step = instrumented(model, OPTIMIZERS[name]())
    x, y = batch(1)
    step.run(0, x, y)  # a second step, so momentum and Adam's moments are not zero
    before = [v.numpy() for v in model.trainable_variables]
    record = step.run(1, x, y)
    after = [v.numpy() for v in model.trainable_variables]
    for stats, b, a in zip(record.variables, before, after):
        change = a.astype(np.float64) - b
        assert stats.weight_norm == pytest.approx(np.linalg.norm(a.astype(np.float64)), rel=1e-5)
        assert stats.update_ratio == pytest.approx(np.linalg.norm(change) / np.linalg.norm(a), rel=1e-3)


def traced_updates(model, optimizer):
    """For each trainable variable, whether `applied_updates` found its change among the optimizer's writes."""
    variables = model.trainable_variables
    optimizer.build(variables)
    x, y = batch()
    found = []

    @tf.function(autograph=False)
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(y, model(x, training=True)))
        grads = tape.gradient(loss, variables)
        start = graph_position()
        optimizer.apply_gradients(zip(grads, variables))
        found.extend(update is not None for update in applied_updates(start, variables))
        return loss

    step(x, y)
    return found


def test_the_optimizer_s_writes_are_found_or_left_to_the_snapshot():
    assert traced_updates(classifier(), keras.optimizers.Adam()) == [True] * 4
    assert traced_updates(classifier(), keras.optimizers.AdamW(weight_decay=0.1)) == [True] * 4
    # A constraint overwrites the kernel after the update: its change is after - before.
    constrained = classifier(keras.constraints.MaxNorm(1.0))
    assert traced_updates(constrained, keras.optimizers.SGD(0.1)) == [False, True, True, True]
    # A LossScaleOptimizer updates inside a conditional: every variable falls back.
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    assert traced_updates(classifier(), scaled) == [False] * 4


def test_a_constrained_kernel_still_reports_its_true_change():
    model = classifier(keras.constraints.MaxNorm(0.5))
    step = instrumented(model, keras.optimizers.SGD(1.0))
    x, y = batch(2)
    before = [v.numpy() for v in model.trainable_variables]
    record = step.run(0, x, y)
    after = [v.numpy() for v in model.trainable_variables]
    kernel = record.variables[0]
    assert kernel.update_ratio == pytest.approx(np.linalg.norm(after[0] - before[0]) / np.linalg.norm(after[0]),
                                                rel=1e-4)


def test_a_softmax_layer_is_probed_without_running_the_softmax_the_loss_skips():
    model = classifier()
    step = instrumented(model, keras.optimizers.SGD(0.0))
    graph = step._traced().graph
    softmaxes = [op for op in graph.get_operations() if op.type == "Softmax"]
    assert softmaxes and all(not out.consumers() for op in softmaxes for out in op.outputs)

    # Logits far apart: many probabilities underflow to exact zeros, which the probe must count. The
    # reference is the layer's own (oneDNN) softmax; the probe's recomputation may round an entry right
    # at float32's underflow threshold the other way.
    x, y = batch(4, spread=100.0)
    probabilities = model(x).numpy()
    record = step.run(0, x, y)
    stats = record.layers[1]
    assert (probabilities == 0).mean() > 0.1
    assert stats.max_abs == pytest.approx(probabilities.max(), rel=1e-5)
    assert stats.mean_abs == pytest.approx(probabilities.mean(), rel=1e-5)
    assert stats.zero_fraction == pytest.approx((probabilities == 0).mean(), abs=3 / probabilities.size)
    assert stats.nonfinite == 0 and record.output_nonfinite == 0


def test_non_finite_predictions_are_counted_by_the_output_layer_s_probe():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4)])
    x = np.ones((5, 3), np.float32)
    x[1, 0], x[3, 2] = np.nan, np.inf
    y = np.zeros((5, 4), np.float32)
    step = InstrumentedStep(from_keras(model, "m"), Loss(keras.losses.MeanSquaredError(), "mse"),
                            keras.optimizers.SGD(0.0), x, y)
    expected = int((~np.isfinite(model(x).numpy())).sum())
    record = step.run(0, x, y)
    assert expected == 8
    assert record.output_nonfinite == expected == record.layers[0].nonfinite


def test_zeros_are_counted_on_a_schedule_and_on_every_nonfinite_step():
    """Exact zeros cost a third pass over a large output: counted every ZEROS_EVERY-th step, else None."""
    from nanscope.engine.probes import ZEROS_EVERY

    model = classifier()
    step = instrumented(model, keras.optimizers.SGD(0.01))
    hidden = keras.Model(model.inputs, model.layers[0].output)
    x, y = batch(1)
    for i in range(ZEROS_EVERY + 1):
        expected = (hidden(x).numpy() == 0).mean()
        stats = step.run(i, x, y).layers[0]
        if i % ZEROS_EVERY:
            assert stats.zero_fraction is None, i
        else:
            assert expected > 0.1 and stats.zero_fraction == pytest.approx(expected), i
        assert stats.max_abs > 0 and stats.mean_abs > 0
    bad = x.copy()
    bad[0, :] = 3e38  # finite data that overflows the layer: off the schedule, but a non-finite output
    output = hidden(bad).numpy()
    stats = step.run(ZEROS_EVERY + 1, bad, y).layers[0]
    assert stats.nonfinite == (~np.isfinite(output)).sum() > 0
    assert stats.zero_fraction == pytest.approx((output == 0).mean())


def test_a_reshape_layer_reuses_the_row_of_the_output_it_reshapes():
    """Flatten holds its input's values: its row is the previous layer's, with no reduction of its own."""
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(HIDDEN, activation="relu"),
                              keras.layers.Reshape((HIDDEN // 10, 10)), keras.layers.Flatten(),
                              keras.layers.Dense(CLASSES, activation="softmax")])
    step = instrumented(model, keras.optimizers.SGD(0.01))
    x, y = batch(1)
    record = step.run(0, x, y)
    dense, reshaped, flat = record.layers[:3]
    assert reshaped == dense and flat == dense and dense.max_abs > 0
    recorder = LayerRecorder(model.layers)

    @tf.function(autograph=False)
    def forward(x):
        recorder.begin()
        with recorder.attached():
            return model(x, training=True), recorder.stats_matrix()

    graph = forward.get_concrete_function(tf.TensorSpec([None, INPUTS])).graph
    reshaped = [op for op in graph.get_operations() if op.type == "Reshape"]  # the Reshape and Flatten layers'
    reduced = {op.inputs[0].name for op in graph.get_operations() if op.type in ("Abs", "Max", "Sum")}
    assert len(reshaped) == 2 and not any(op.outputs[0].name in reduced for op in reshaped)


@pytest.mark.parametrize("count_zeros", [None, True, False], ids=["no-schedule", "due", "not-due"])
def test_tensor_stats_counts_zeros_unless_the_schedule_says_not(count_zeros):
    """Without a schedule (tf.distribute's replicas) every step counts them, on the healthy path."""
    from nanscope.engine.probes import tensor_stats
    from nanscope.engine.schema import LAYER, NOT_COUNTED

    x = np.maximum(np.random.default_rng(0).standard_normal((64, 100)), 0).astype(np.float32)
    due = None if count_zeros is None else tf.constant(count_zeros)
    row = tf.function(lambda t: tensor_stats([tf.nn.relu(t)], due), autograph=False)(x).numpy()
    assert row[LAYER.at("max_abs")] == pytest.approx(x.max())
    assert row[LAYER.at("zeros")] == (NOT_COUNTED if count_zeros is False else (x == 0).sum())


def test_the_instrumented_step_is_traced_once():
    # nanscope's own variables are made before the step is traced: one made while a tf.function traces its first
    # call makes TensorFlow trace it a second time (its zeros counter did, doubling every trace-steps start-up).
    step = instrumented(classifier(), keras.optimizers.Adam(0.01))
    x, y = batch(1)
    assert len(step.layer_call_order) == 2
    for i in range(3):
        step.run(i, x, y)
    assert step._compiled.experimental_get_tracing_count() == 1
