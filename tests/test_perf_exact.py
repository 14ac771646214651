"""The compact statistics paths against numpy: small and large tensors, healthy and not, with and without XLA."""

from pathlib import Path

import numpy as np
import pytest

from nanscope.run import trace as trace_module
from nanscope.engine.exact import SMALL_ROW_SIZE, SMALL_SIZE, small
from nanscope.engine.variable_stats import any_nonfinite_count, variable_rows
from nanscope.engine.probes import combine_layer_rows, tensor_stats
from nanscope.engine.schema import LAYER, LAYER_STATISTICS, NOT_COUNTED, combined_layer_rows
from nanscope.runtime import tensorflow
from nanscope.spec.load import parse_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

tf, keras = tensorflow()
SPECS = Path(__file__).parent / "specs"


def graph(fn, *args, jit_compile=False):
    """fn(*args) traced the way the step traces it, as numpy."""
    result = tf.function(fn, autograph=False, jit_compile=jit_compile)(*args)
    return tf.nest.map_structure(lambda t: t.numpy(), result)


def norm(array):
    finite = array[np.isfinite(array)].astype(np.float64)
    return np.nan if finite.size < array.size else float(np.sqrt(np.sum(finite ** 2)))


def spoiled(array, kind, rng):
    array = array.copy()
    if kind == "nan":
        array.flat[rng.integers(array.size)] = np.nan
    elif kind == "inf":
        array.flat[rng.integers(array.size)] = -np.inf
    elif kind == "huge":  # finite entries whose sum of squares overflows float32
        array[...] = 3e20
    return array


@pytest.mark.parametrize("shape", [(20, 25), (300, 40)], ids=["small", "large"])
@pytest.mark.parametrize("kind", ["healthy", "nan", "inf", "huge"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_variable_rows_equal_numpy(shape, kind, jit_compile):
    rng = np.random.default_rng(0)
    shapes = [shape, (shape[1],), (shape[1], 1), (1,)]
    before = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads[0] = spoiled(grads[0], kind, rng)
    after = [b - 0.1 * g for b, g in zip(before, grads)]
    assert small([tf.constant(t) for t in grads + after + before]) == (shape == (20, 25))

    rows, grad_norm, _ = graph(lambda g, b, a: variable_rows(g, b, a), grads, before, after, jit_compile=jit_compile)

    for row, g, b, a in zip(rows, grads, before, after):
        expected = [norm(g), np.sum(~np.isfinite(g)), norm(a), norm(a - b), np.sum(~np.isfinite(a))]
        np.testing.assert_allclose(row, expected, rtol=1e-5)
    total = np.sqrt(sum(norm(g) ** 2 for g in grads))
    np.testing.assert_allclose(grad_norm, total if np.isfinite(total) else np.nan, rtol=1e-5)


def test_an_empty_variable_has_norm_zero_in_a_non_finite_step():
    grads = [np.array([np.nan, 1.0], np.float32), np.zeros([0], np.float32)]
    weights = [np.ones(2, np.float32), np.zeros([0], np.float32)]
    rows, _, _ = graph(lambda g, w: variable_rows(g, w, w), grads, weights)
    assert rows[1].tolist() == [0.0] * 5 and rows[0][1] == 1


@pytest.mark.parametrize("width", [SMALL_ROW_SIZE, 200], ids=["small", "large"])
@pytest.mark.parametrize("kind", ["healthy", "nan", "inf", "zeros"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_tensor_stats_equal_numpy(width, kind, dtype):
    rng = np.random.default_rng(1)
    output = rng.standard_normal((16, width)).astype(np.float32)
    output[:, ::3] = 0.0 if kind == "zeros" else output[:, ::3]
    output[0, 1:3] = 1e-6  # subnormal in float16
    output = spoiled(output, kind, rng).astype(dtype)
    spec = tf.TensorSpec([None, width], dtype)

    row = tf.function(lambda x: tensor_stats([x]), input_signature=[spec], autograph=False)(output).numpy()

    # Every statistic against its numpy reference, as schema.LAYER_STATISTICS declares it.
    expected = [statistic.expected(output.astype(np.float64), dtype == "float16") for statistic in LAYER_STATISTICS]
    np.testing.assert_allclose(row, expected, rtol=1e-6)
    if kind == "healthy":  # the reference counts the two subnormal entries of a float16 output
        assert row[LAYER.at("tiny")] == (2 if dtype == "float16" else 0)


def test_tensor_stats_of_several_outputs_add_up():
    first, second = np.array([[1.0, -4.0]], np.float32), np.array([[0.0, np.inf, 2.0]], np.float32)
    row = graph(lambda a, b: tensor_stats([a, b, tf.constant([7])]), first, second)
    np.testing.assert_allclose(row, [4.0, 7.0, 1.0, 1.0, 5.0, 0.0])


@pytest.mark.parametrize("zeros", ["counted", "not-counted"])
def test_calls_and_replicas_combine_as_each_statistic_declares(zeros):
    """Two calls of one layer (probes, in the graph) and two replicas' rows (distributed, numpy) make the row of
    all their values, each statistic combined as LAYER_STATISTICS says; zeros not counted by one stay NOT_COUNTED."""
    rng = np.random.default_rng(2)
    parts = [rng.standard_normal((4, 300)).astype(np.float16) for _ in range(2)]
    parts[1][0, :5] = [np.nan, 0.0, 1e-6, -np.inf, 3e4]
    count = tf.constant(zeros == "counted")
    rows = [tf.function(lambda x: tensor_stats([x], count), autograph=False)(p).numpy() for p in parts]
    rows[0][LAYER.at("zeros")] = parts[0].size - np.count_nonzero(parts[0]) if zeros == "counted" else NOT_COUNTED
    whole = np.concatenate([p.astype(np.float64).ravel() for p in parts])
    expected = [statistic.expected(whole, True) for statistic in LAYER_STATISTICS]
    if zeros == "not-counted":
        expected[LAYER.at("zeros")] = NOT_COUNTED
    in_graph = graph(combine_layer_rows, np.stack(rows))
    np.testing.assert_allclose(in_graph, expected, rtol=1e-6)
    np.testing.assert_allclose(combined_layer_rows(np.stack(rows)), expected, rtol=1e-6)


@pytest.mark.parametrize("width", [8, 2000], ids=["small", "large"])
@pytest.mark.parametrize("jit_compile", [False, True], ids=["graph", "xla"])
def test_any_nonfinite_count(width, jit_compile):
    batch = np.ones((4, width), np.float32)
    batch[1, 3], batch[2, 5] = np.nan, np.inf
    assert graph(any_nonfinite_count, batch, jit_compile=jit_compile) == 2
    assert graph(any_nonfinite_count, np.ones((4, width), np.float32), jit_compile=jit_compile) == 0
    # A sum of finite entries that overflows is not a non-finite entry.
    assert graph(any_nonfinite_count, np.full((4, width), 3e38, np.float32), jit_compile=jit_compile) == 0


def test_small_sizes():
    assert small([tf.zeros([SMALL_SIZE])]) and not small([tf.zeros([SMALL_SIZE + 1])])
    batch = tf.TensorSpec([None, SMALL_ROW_SIZE])

    @tf.function(input_signature=[batch, tf.TensorSpec([None, SMALL_ROW_SIZE + 1])], autograph=False)
    def decide(narrow, wide):
        assert small([narrow]) and not small([wide]) and not small([narrow, wide])
        return narrow

    decide.get_concrete_function()


def test_chunked_and_single_step_runs_record_the_same(tmp_path, monkeypatch):
    document = {
        "model": {"factory": f"{SPECS / 'phase_models.py'}:dense"},
        "data": {"factory": f"{SPECS / 'data_factories.py'}:arrays", "batch_size": 16, "shuffle": False},
        "train": {"loss": "mse", "optimizer": {"name": "sgd", "learning_rate": 0.01}, "steps": 6, "seed": 0},
    }

    def records(min_steps):
        monkeypatch.setattr(trace_module, "CHUNK_MIN_STEPS", min_steps)
        spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
        return run_trace(spec, TraceOptions(trace_path=tmp_path / f"{min_steps}.jsonl")).records

    chunked, single = records(1), records(10_000)
    assert len(chunked) == len(single) == 6
    for one, other in zip(chunked, single):
        assert one.loss == pytest.approx(other.loss, rel=1e-6)
        assert [v.grad_norm for v in one.variables] == pytest.approx([v.grad_norm for v in other.variables], rel=1e-5)
        assert [layer.mean_abs for layer in one.layers] == pytest.approx([layer.mean_abs for layer in other.layers],
                                                                           rel=1e-6)


def test_a_traced_graph_is_freed_with_its_function():
    # The shared constants are cached per graph; a cache entry that held its tensors (and so its graph) kept
    # every graph that used one alive for the life of the process (bench/README.md: the replay loop).
    import gc
    import weakref

    from nanscope.engine.exact import constant

    function = tf.function(lambda x: tf.reshape(x, constant((-1,), "int32")) * constant(2.0), autograph=False)
    assert function(tf.ones([2, 2])).numpy().tolist() == [2.0] * 4
    graph = weakref.ref(function.get_concrete_function(tf.TensorSpec([2, 2], tf.float32)).graph)
    del function
    gc.collect()
    assert graph() is None
