"""The private Keras, TensorFlow and Typer hooks of nanscope.internals, one canary per hook.

A failure here names the hook and the installed versions: a Keras, TensorFlow or Typer
upgrade changed something nanscope relies on, and nanscope/internals/ is the one place to adapt.
"""

import gc
import inspect
import os
import sys
import weakref

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from importlib.metadata import version

import numpy as np
import pytest
import typer

from nanscope import internals
from nanscope.engine.model_view import as_handed
from nanscope.internals import override, overridden, restore
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
VERSIONS = f"tensorflow {tf.__version__}, keras {keras.__version__}, typer {version('typer')}"


class Owner:
    def greet(self):
        return "class"


def test_override_and_restore_put_back_an_instance_attribute_or_its_absence():
    owner = Owner()
    saved = override(owner, "greet", lambda: "hooked")
    assert owner.greet() == "hooked"
    restore(saved)
    assert owner.greet() == "class" and "greet" not in owner.__dict__
    owner.greet = lambda: "instance"
    restore(override(owner, "greet", lambda: "hooked"))
    assert owner.greet() == "instance"


def test_overridden_restores_even_when_the_block_raises():
    owner = Owner()
    with pytest.raises(RuntimeError), overridden([(owner, "greet", lambda greet: lambda: greet().upper())]):
        assert owner.greet() == "CLASS"
        raise RuntimeError
    assert owner.greet() == "class" and "greet" not in owner.__dict__


# --- canaries: one per private Keras or TensorFlow hook ---------------------------------------------------

def canary(hook, check):
    """Run `check`; a failure says which private hook changed and under which versions."""
    try:
        problem = check()
    except Exception as exc:  # the hook is gone or changed shape: that is what a canary reports
        problem = f"{type(exc).__name__}: {exc}"
    if problem:
        pytest.fail(f"private hook {hook} no longer works as nanscope/internals/ expects under {VERSIONS}: "
                    f"{problem}", pytrace=False)


def two_heads():
    keras.utils.set_random_seed(0)
    inputs = keras.Input((3,), name="features")
    hidden = keras.layers.Dense(4, name="hidden", kernel_regularizer=keras.regularizers.L2(0.1))(inputs)
    model = keras.Model(inputs, {"price": keras.layers.Dense(1, name="price")(hidden),
                                 "kind": keras.layers.Dense(2, name="kind")(hidden)})
    model.compile(optimizer=keras.optimizers.SGD(0.01, clipnorm=1.0), loss={"price": "mse", "kind": "mse"},
                  loss_weights={"price": 2.0, "kind": 0.5})
    x = np.ones((4, 3), np.float32)
    model.fit(x, {"price": np.ones((4, 1)), "kind": np.ones((4, 2))}, epochs=1, verbose=0)
    return model


def test_canary_flatten_layers():
    inner = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, name="inner_dense")], name="inner")
    model = keras.Sequential([keras.Input((2,)), inner, keras.layers.Dense(1, name="outer_dense")])

    def check():
        names = [layer.name for layer in internals.flatten_layers(model) if type(layer).__name__ != "InputLayer"]
        return None if names == ["inner", "inner_dense", "outer_dense"] else f"got {names}"

    canary("Layer._flatten_layers", check)


def test_canary_symbolic_build():
    class Subclassed(keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def call(self, x):
            return self.dense(x)

    model = Subclassed()
    model.compile(optimizer="sgd", loss="mse")
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 2], tf.float32))

    def check():
        internals.symbolic_build(model, spec)
        built = model.built and len(model.trainable_variables) == 2 and model.optimizer.built
        return None if built else "the model or its optimizer is not built"

    canary("Trainer._symbolic_build", check)


def test_canary_compile_metrics_built():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    spec = (tf.TensorSpec([None, 3], tf.float32), tf.TensorSpec([None, 1], tf.float32))

    def check():
        if internals.compile_metrics_built(model):
            return "the compiled metrics were built before any step"
        internals.symbolic_build(model, spec)
        names = [v.path for v in model.metrics_variables]
        if not internals.compile_metrics_built(model) or "mean_absolute_error/total" not in names:
            return f"symbolic_build did not build the compiled metrics: {names}"
        return None

    canary("CompileMetrics.built", check)


def test_canary_own_losses():
    class Penalised(keras.layers.Layer):
        def call(self, x):
            self.add_loss(tf.reduce_sum(x))
            return x

    layer = keras.layers.Dense(1, kernel_initializer="ones", kernel_regularizer=keras.regularizers.L2(0.5))
    layer.build((None, 2))
    penalised = Penalised()
    penalised(tf.ones((1, 3)))

    def check():
        regularised = [float(t) for t in internals.own_losses(layer)]
        added = [float(t) for t in internals.own_losses(penalised, regularizers=False)]
        if regularised != [pytest.approx(1.0)] or added != [pytest.approx(3.0)]:
            return f"regularizer terms {regularised} (expected [1.0]), add_loss terms {added} (expected [3.0])"
        return None

    canary("Layer._get_own_losses / Layer._trainable_variables", check)


# Keras 3.3 has no per-output `_flat_losses` nor build structures: the callback then records the total
# loss only. These two canaries are left out of the oldest-versions smoke run (.ci/run).
@pytest.mark.per_output_losses
def test_canary_compiled_loss_weights_and_output_losses():
    model = two_heads()

    def check():
        weights = internals.compiled_loss_weights(model)
        entries = {str(e.name): (tuple(e.path), e.loss_weights) for e in internals.compiled_output_losses(model)}
        if weights != {"price": 2.0, "kind": 0.5}:
            return f"_user_loss_weights is {weights!r}"
        if set(entries) != {"price", "kind"} or entries["price"][1] != 2.0:
            return f"_flat_losses gives {entries!r}"
        return None

    canary("CompileLoss._user_loss_weights / CompileLoss._flat_losses", check)


@pytest.mark.per_output_losses
def test_canary_compiled_structures():
    model = two_heads()

    def check():
        y_true, y_pred = internals.compiled_structures(model)
        if not (isinstance(y_true, dict) and set(y_true) == {"price", "kind"} and isinstance(y_pred, dict)):
            return f"got {y_true!r}, {y_pred!r}"
        return None

    canary("CompileLoss._y_true_build_structure / _y_pred_build_structure", check)


def test_canary_clip_gradients_is_where_the_optimizer_clips():
    variable = tf.Variable([0.0, 0.0])
    optimizer = keras.optimizers.SGD(1.0, clipnorm=1.0)
    optimizer.build([variable])
    seen = []

    def wrap(clip):
        def watched(grads):
            seen.append([g.numpy().tolist() for g in grads])
            return clip(grads)

        return watched

    def check():
        with internals.overridden([internals.clip_gradients_hook(optimizer, wrap)]):
            optimizer.apply_gradients([(tf.constant([3.0, 4.0]), variable)])
        if seen != [[[3.0, 4.0]]]:
            return f"the wrapped method saw {seen}"
        if not np.allclose(variable.numpy(), [-0.6, -0.8]):
            return f"the update was {variable.numpy().tolist()}, not the clipped [-0.6, -0.8]"
        return None

    canary(f"optimizer.{internals.CLIP_GRADIENTS}", check)


def test_canary_all_reduce_sum_gradients_gets_the_gradients_apply_was_handed():
    variable = tf.Variable([0.0, 0.0])
    optimizer = keras.optimizers.SGD(1.0)
    optimizer.build([variable])
    grad = tf.constant([3.0, 4.0])
    seen = []

    def wrap(reduce):
        def watched(grads_and_vars):
            grads_and_vars = list(grads_and_vars)
            reduced = reduce(grads_and_vars)
            seen.append(([g is grad for g, _ in grads_and_vars], [s.numpy().tolist() for s, _ in reduced]))
            return reduced

        return watched

    def check():
        hooks = internals.all_reduce_gradients_hooks(optimizer, wrap)
        if [(owner, name) for owner, name, _ in hooks] != [(optimizer, internals.ALL_REDUCE_GRADIENTS)]:
            return f"the optimizer has no {internals.ALL_REDUCE_GRADIENTS}"
        with internals.overridden(hooks):
            optimizer.apply([grad], [variable])
        if seen != [([True], [[3.0, 4.0]])]:
            return f"the wrapped method saw (the handed gradient?, the sums) {seen}"
        if not np.allclose(variable.numpy(), [-3.0, -4.0]):
            return f"the update was {variable.numpy().tolist()}"
        return None

    canary(f"optimizer.{internals.ALL_REDUCE_GRADIENTS}", check)


def test_canary_a_traced_apply_with_keras_sum_of_the_replicas_skipped_keeps_no_graph():
    # engine/step.py skips the optimizer's all-reduce of the replicas' gradients on one replica (a
    # LossScaleOptimizer's inner optimizer sums): traced, that all-reduce registers a gradient function in
    # TensorFlow's global registry that holds the graph for good, and a loop of replays kept every step graph.
    def traced_apply(optimizer):
        variable = tf.Variable([0.0, 0.0])
        optimizer.build([variable])
        scale = float(optimizer.dynamic_scale.numpy()) if hasattr(optimizer, "inner_optimizer") else 1.0
        function = tf.function(lambda grad: optimizer.apply_gradients([(grad, variable)]), autograph=False)
        summing = getattr(optimizer, "inner_optimizer", optimizer)
        with internals.overridden(internals.all_reduce_gradients_hooks(summing, as_handed)):
            traced = function.get_concrete_function(tf.TensorSpec([2], tf.float32))
        traced(tf.constant([3.0, 4.0]) * scale)
        graph = weakref.ref(traced.graph)
        del function, traced
        gc.collect()
        if graph() is not None:
            return f"a traced {type(optimizer).__name__}.apply_gradients kept its graph"
        if variable.numpy().tolist() != [-3.0, -4.0]:
            return f"{type(optimizer).__name__}'s update was {variable.numpy().tolist()}, not [-3.0, -4.0]"
        return None

    def check():
        return traced_apply(keras.optimizers.SGD(1.0)) or traced_apply(
            keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(1.0)))

    canary(f"optimizer.{internals.ALL_REDUCE_GRADIENTS} (traced, one replica)", check)


def test_canary_op_callbacks_and_the_gradient_function_frame():
    seen, differentiated = [], []

    def callback(op_type, inputs, attrs, outputs, op_name=None, graph=None):
        seen.append(op_type)
        forward, _, _ = internals.differentiated_op(sys._getframe(1))
        if forward is not None:
            differentiated.append(forward)

    x = tf.Variable([1.0, 2.0])

    def check():
        with internals.op_callback(callback), tf.GradientTape() as tape:
            y = tf.reduce_sum(tf.exp(x))
        with internals.op_callback(callback):
            tape.gradient(y, x)
        if "Exp" not in seen:
            return f"tensorflow.python.framework.op_callbacks saw {seen}, not Exp"
        if "Exp" not in differentiated:
            return f"no {internals.GRADIENT_FUNCTION} frame named Exp while its gradient ran (saw {differentiated})"
        return None

    canary("tensorflow.python.framework.op_callbacks / backprop._gradient_function", check)


def test_canary_functional_graph():
    tokens = keras.Input((3,), name="tokens", dtype="int32")
    numbers = keras.Input((2,), name="numbers")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(10, 2, name="embed")(tokens))
    model = keras.Model({"tokens": tokens, "numbers": numbers},
                        keras.layers.Dense(1)(keras.layers.Concatenate()([embedded, numbers])))
    embed = model.get_layer("embed")

    def check():
        struct = internals.inputs_struct(model)
        if not (isinstance(struct, dict) and set(struct) == {"tokens", "numbers"}):
            return f"_inputs_struct is {struct!r}"
        if [id(t) for t in internals.inbound_tensors(embed)] != [id(struct["tokens"])]:
            return f"_inbound_nodes gives {internals.inbound_tensors(embed)!r}"
        return None

    canary("Functional._inputs_struct / Layer._inbound_nodes", check)


def test_canary_the_given_learning_rate_and_the_raw_step_counter():
    def check():
        schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 4, 0.5)
        optimizer = keras.optimizers.SGD(schedule, gradient_accumulation_steps=2)
        variable = keras.Variable([1.0])
        for _ in range(3):
            optimizer.apply_gradients([(tf.constant([1.0]), variable)])
        if internals.given_learning_rate(optimizer) is not schedule:
            return f"optimizer.{internals.LEARNING_RATE} is {internals.given_learning_rate(optimizer)!r}"
        if internals.raw_iterations(optimizer) != 3:
            return f"optimizer.{internals.RAW_ITERATIONS} counted {internals.raw_iterations(optimizer)} applies, not 3"
        if not np.isclose(float(optimizer.learning_rate), float(schedule(3))):
            return "the schedule is no longer evaluated at the raw counter"
        return None

    canary(f"optimizer.{internals.LEARNING_RATE} / {internals.RAW_ITERATIONS}", check)


def test_canary_a_tf_functions_jit_compile():
    def check():
        seen = (internals.jit_compile_of(tf.function(lambda x: x, jit_compile=True)),
                internals.jit_compile_of(tf.function(lambda x: x)), internals.jit_compile_of(lambda x: x))
        return None if seen == (True, None, None) else f"tf.function.{internals.JIT_COMPILE} read {seen}"

    canary(f"tf.function.{internals.JIT_COMPILE}", check)


def test_canary_a_variable_made_past_the_creator_scopes_adds_no_trace():
    def traces(make):
        made, calls = [], []

        @tf.function
        def step(x):
            calls.append(1)
            if not made:
                with tf.init_scope():
                    made.append(make(tf.constant(1.0), trainable=False))
            return x + made[0]

        values = [float(step(tf.constant(float(i)))) for i in range(3)]
        return len(calls), values

    def check():
        untraced, counted = traces(internals.untraced_variable), traces(tf.Variable)
        if counted[0] != 2:  # what keras.trace_count restores with its one counted variable
            return f"a tf.Variable made in the first trace made TensorFlow trace {counted[0]} times, not 2"
        if untraced != (1, [1.0, 2.0, 3.0]):
            return f"untraced_variable: {untraced[0]} traces, values {untraced[1]} (expected 1, [1.0, 2.0, 3.0])"
        return None

    canary("resource_variable_ops.ResourceVariable past tf.function's variable creator scope", check)


def test_canary_keras_global_seed_generator():
    def check():
        internals.set_keras_global_seed_generator(None)
        keras.random.normal((1,))  # an unseeded call makes the global generator and advances it
        generator = internals.keras_global_seed_generator()
        if generator is None or not isinstance(generator, keras.random.SeedGenerator):
            return f"no global SeedGenerator after an unseeded keras.random.normal: {generator!r}"
        state = generator.state.numpy()
        keras.random.normal((1,))
        if np.array_equal(generator.state.numpy(), state):
            return "an unseeded keras.random.normal no longer advances the global SeedGenerator's state"
        internals.set_keras_global_seed_generator(None)
        if internals.keras_global_seed_generator() is not None:
            return "the global SeedGenerator could not be put back to None"
        return None

    canary("keras.src.random.seed_generator.global_seed_generator", check)


def test_canary_the_train_step_replaced_for_a_fit():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x, y = np.ones((4, 2), np.float32), np.ones((4, 1), np.float32)
    traced, executed = [], []

    def step(data):
        traced.append(None)
        return type(model).train_step(model, data)

    def check():
        saved = internals.replace_train_step(model, step)
        function = internals.rebuild_train_function(model)

        def counted(iterator):
            executed.append(None)
            return function(iterator)

        internals.set_train_function(model, counted)
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        if not traced or len(executed) != 2:
            return (f"fit traced the replaced train_step {len(traced)} times and called the set train_function "
                    f"{len(executed)} times (expected: traced, and 2 calls for 2 batches)")
        restore(saved)
        internals.set_train_function(model, None)  # as compile leaves it: fit builds its own again
        traced.clear(), executed.clear()
        model.fit(x, y, batch_size=2, epochs=1, verbose=0)
        if traced or executed or "train_step" in model.__dict__:
            return "the model's own train step did not come back once restored"
        return None

    canary("model.train_step / train_function / make_train_function(force=True)", check)


def test_canary_compile_config():
    def check():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        if internals.compile_config(model) != {}:
            return f"an uncompiled model's compile config reads {internals.compile_config(model)!r}"
        model.compile(optimizer="sgd", loss="mae", metrics=["mse"])
        config = internals.compile_config(model)
        if config.get("loss") != "mae" or config.get("metrics") != ["mse"]:
            return f"model._compile_config.config reads {config!r}"
        return None

    canary("model._compile_config", check)


def test_canary_typers_usage_error():
    app = typer.Typer()

    @app.command()
    def run(count: int):
        del count  # Unused: the option's parsing is what is tested

    def check():
        try:
            app(["not-a-number"], standalone_mode=False)
        except internals.usage_error() as exc:
            return None if "'count'" in exc.format_message() else f"the message is {exc.format_message()!r}"
        except Exception as exc:
            return f"a bad value raised {type(exc).__module__}.{type(exc).__name__}, not {internals.usage_error()}"
        return "a bad value raised nothing"

    canary("typer._click.exceptions.UsageError", check)


def test_canary_a_functions_graph_and_one_op_run_eagerly():
    @tf.function
    def inner(x):
        return tf.exp(x) * 2.0

    @tf.function
    def outer(x):
        return inner(x) + 1.0

    def check():
        outer(tf.constant([0.0]))
        graph = outer.get_concrete_function(tf.TensorSpec([1], tf.float32)).graph
        calls = [op for op in graph.get_operations() if op.type in ("PartitionedCall", "StatefulPartitionedCall")]
        if not calls:
            return f"the outer graph calls no function: {[op.type for op in graph.get_operations()]}"
        inner_graph = internals.function_graph(calls[0].get_attr("f").name)
        exp = [op for op in inner_graph.get_operations() if op.type == "Exp"]
        if not exp:
            return f"the inner function's graph holds {[op.type for op in inner_graph.get_operations()]}"
        result = internals.execute_op("Exp", 1, [tf.constant([0.0, 1.0])], ("T", exp[0].get_attr("T")))
        if not np.allclose(np.asarray(result[0]), [1.0, np.e]):
            return f"Exp run eagerly gave {result!r}"
        return None

    canary("function_def_to_graph(context.get_function_def) / execute.execute", check)


def test_canary_the_collective_runtime_of_a_multi_worker_run():
    # tests/test_multi_worker.py runs these on a real 2-worker cluster; a process that has started its devices
    # cannot form one, so here each hook's shape is checked: the names and keywords nanscope calls it with.
    def check():
        from tensorflow.python.distribute import collective_all_reduce_strategy as collective
        from tensorflow.python.eager import context
        from tensorflow.python.framework import errors

        ctx = context.context()
        wanted = {"configure_coordination_service": {"service_type", "service_leader", "coordinated_jobs",
                                                     "cluster_register_timeout_in_ms", "heartbeat_timeout_in_ms",
                                                     "shutdown_barrier_timeout_in_ms"},
                  "set_config_key_value": set(), "get_config_key_value": set(), "abort_collective_ops": set()}
        for name, keywords in wanted.items():
            missing = keywords - set(inspect.signature(getattr(ctx, name)).parameters)
            if missing:
                return f"context.{name} lacks the keywords {sorted(missing)}"
        from nanscope.internals.tensorflow import coordination_config_module

        if coordination_config_module().CoordinatedJob(name="worker", num_tasks=2).num_tasks != 2:
            return "CoordinatedJob does not hold num_tasks"
        if not isinstance(errors.DEADLINE_EXCEEDED, int):
            return f"errors.DEADLINE_EXCEEDED is {errors.DEADLINE_EXCEEDED!r}"
        extended = collective.CollectiveAllReduceExtended
        original = getattr(extended, internals.INITIALIZE_LOCAL_DEVICES)
        if list(inspect.signature(original).parameters) != ["self", "cluster_resolver", "worker_device"]:
            return f"{internals.INITIALIZE_LOCAL_DEVICES} takes {list(inspect.signature(original).parameters)}"
        with internals.local_devices_chosen(lambda devices, kind, worker: (devices, kind)):
            patched = getattr(extended, internals.INITIALIZE_LOCAL_DEVICES)
        if patched is original or getattr(extended, internals.INITIALIZE_LOCAL_DEVICES) is not original:
            return "local_devices_chosen did not patch the method inside its block and put it back after"
        return None

    canary("context coordination service and key-value store / CollectiveAllReduceExtended."
           f"{internals.INITIALIZE_LOCAL_DEVICES}", check)
