"""TensorFlow's private surface: `tensorflow.python` (and other non-public TensorFlow modules) and the
private attributes nanscope reads or patches.

A variable made past the variable creator scopes (one a tracing tf.function does not count), TensorFlow's op
callbacks and the `_gradient_function` frame of its gradient tape (forensics),
a tf.function's `_jit_compile`, the eager context's function library and op execution (the
replay of a SavedModel's functions), and the collective runtime of a multi-worker run: its
coordination service and key-value store, aborting collectives, and the strategy's
`_initialize_local_devices`. TensorFlow is imported inside the functions, never at module
level: `nanscope --help` does not import it.
"""

import contextlib
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

# --- tf.function ----------------------------------------------------------------------------------------

# A tf.function's `jit_compile` argument (tensorflow/python/eager/polymorphic_function): instrument
# compiles its instrumented step the same way, so XLA's random numbers stay the user's.
JIT_COMPILE = "_jit_compile"


def jit_compile_of(function: Any) -> Any:
    """The `jit_compile` a tf.function was made with (True, False or None); None for a plain function."""
    return getattr(function, JIT_COMPILE, None)


# --- variables made while a step traces ------------------------------------------------------------------


def untraced_variable(initial_value: Any, **kwargs: Any) -> Any:
    """A tf.Variable made outside any graph (call it under `tf.init_scope()`) that a tf.function tracing at the
    time does not take for one of its own.

    A variable made while a tf.function traces its first call makes TensorFlow trace that function a second
    time (`_created_variables`), and with it draw once more the seed of every unseeded legacy random op in the
    user's step: a seed the run without nanscope never draws. Constructed as a `ResourceVariable` directly,
    past the variable creator scopes (`tensorflow/python/ops/resource_variable_ops.py`), the tf.function never
    hears of it. Under a tf.distribute strategy the strategy's creator must place it: there it is a plain
    `tf.Variable`.
    """
    import tensorflow as tf
    from tensorflow.python.ops import resource_variable_ops

    if tf.distribute.has_strategy():
        return tf.Variable(initial_value, **kwargs)
    return resource_variable_ops.ResourceVariable(initial_value, **kwargs)


# --- op callbacks and the gradient tape ----------------------------------------------------------------


@contextlib.contextmanager
def op_callback(callback: Callable[..., Any]) -> Iterator[None]:
    """Call `callback(op_type, inputs, attrs, outputs, op_name=None, graph=None)` for every op run eagerly in
    the block (`tensorflow.python.framework.op_callbacks`); always removed."""
    from tensorflow.python.framework import op_callbacks

    op_callbacks.add_op_callback(callback)
    try:
        yield
    finally:
        op_callbacks.remove_op_callback(callback)


# The tape's function that computes one op's gradient (tensorflow/python/eager/backprop.py); its
# locals name the forward op being differentiated.
GRADIENT_FUNCTION = "_gradient_function"


def differentiated_op(frame: FrameType | None) -> tuple[str | None, list[Any], list[Any]]:
    """(op type, inputs, outputs) of the forward op whose gradient is being computed, found in the frames
    from `frame` outward (TensorFlow's `_gradient_function` locals); (None, [], []) outside a gradient."""
    while frame is not None:
        if frame.f_code.co_name == GRADIENT_FUNCTION and "op_name" in frame.f_locals:
            local = frame.f_locals
            return local["op_name"], list(local.get("inputs") or ()), list(local.get("outputs") or ())
        frame = frame.f_back
    return None, [], []


# --- the eager context's function library and op execution (forensics/functions.py) --------------------


def function_graph(name: str) -> Any:
    """The FuncGraph of the function `name` in the eager context's library (a SavedModel's inner function, a
    call op's `f`), rebuilt from its FunctionDef (`function_def_to_graph`)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph

    return function_def_to_graph(context.context().get_function_def(name))


def execute_op(op_type: str, outputs: int, operands: list[Any], attrs: tuple[Any, ...]) -> Any:
    """Run one op eagerly (`execute.execute`): `outputs` results of `op_type` on `operands`, with `attrs` the
    flat (name, value, ...) tuple of its attributes."""
    from tensorflow.python.eager import context, execute

    return execute.execute(op_type, outputs, operands, attrs, context.context())


# --- the collective runtime of a multi-worker run (engine/cluster.py, engine/deadline.py) ---------------


def coordination_config_module() -> Any:
    """TensorFlow's `coordination_config_pb2`: under `tensorflow.compiler.xla.tsl.protobuf` since TensorFlow 2.17,
    `tensorflow.tsl.protobuf` before (2.16, the oldest supported)."""
    try:
        from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    except ImportError:
        from tensorflow.tsl.protobuf import coordination_config_pb2
    return coordination_config_pb2


def configure_coordination(workers: int, register_timeout_ms: int, heartbeat_timeout_ms: int,
                           shutdown_timeout_ms: int) -> None:
    """Configure TensorFlow's standalone coordination service for `workers` tasks of the job "worker", led by
    task 0 (`context.configure_coordination_service`); before the strategy joins the cluster."""
    from tensorflow.python.eager import context

    coordination_config_pb2 = coordination_config_module()
    context.context().configure_coordination_service(
        service_type="standalone", service_leader="/job:worker/replica:0/task:0",
        cluster_register_timeout_in_ms=register_timeout_ms, heartbeat_timeout_in_ms=heartbeat_timeout_ms,
        shutdown_barrier_timeout_in_ms=shutdown_timeout_ms,
        coordinated_jobs=[coordination_config_pb2.CoordinatedJob(name="worker", num_tasks=workers)])


def set_config_key_value(key: str, value: str) -> None:
    """Publish `value` (a str) under `key` in the cluster's coordination key-value store."""
    from tensorflow.python.eager import context

    context.context().set_config_key_value(key, value)


def get_config_key_value(key: str, timeout_ms: int) -> Any:
    """The value under `key` in the coordination key-value store, waiting up to `timeout_ms` for it to be set."""
    from tensorflow.python.eager import context

    return context.context().get_config_key_value(key, timeout_ms)


def abort_collective_ops(message: str) -> None:
    """Fail every pending and future collective op of the process with DeadlineExceeded(`message`)."""
    from tensorflow.python.eager import context
    from tensorflow.python.framework import errors

    context.context().abort_collective_ops(errors.DEADLINE_EXCEEDED, message)


# The method MultiWorkerMirroredStrategy asks for a worker's local devices
# (tensorflow/python/distribute/collective_all_reduce_strategy.py): on a CPU-only worker it gives one
# device, whatever the logical CPUs configured.
INITIALIZE_LOCAL_DEVICES = "_initialize_local_devices"


@contextlib.contextmanager
def local_devices_chosen(choose: Callable[..., tuple[Any, Any]]) -> Iterator[None]:
    """While the block runs, a MultiWorkerMirroredStrategy created in it takes its local devices from
    `choose(devices, kind, worker_device) -> (devices, kind)`, given what TensorFlow picked; always put back.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as collective

    extended = collective.CollectiveAllReduceExtended
    original = getattr(extended, INITIALIZE_LOCAL_DEVICES)

    def local_devices(self: Any, cluster_resolver: Any, worker_device: str) -> tuple[Any, Any]:
        return choose(*original(self, cluster_resolver, worker_device), worker_device)

    setattr(extended, INITIALIZE_LOCAL_DEVICES, local_devices)
    try:
        yield
    finally:
        setattr(extended, INITIALIZE_LOCAL_DEVICES, original)
