"""Every private Keras, TensorFlow and Typer hook nanscope relies on, in one place.

nanscope reads and wraps a few things that are not public API; each is reached only
through a function here, in the module of the library it belongs to:

- `internals.keras`: Keras' CompileLoss, `Layer._flatten_layers` and `_get_own_losses`,
  the optimizer's `_clip_gradients`, `_all_reduce_sum_gradients`, `_learning_rate` and
  `_iterations`, the functional graph, the global SeedGenerator, the compile config, and the
  surgery on a model's train step (`train_step`, `train_function`, `make_train_function(force=True)`);
- `internals.tensorflow`: a variable a tracing tf.function does not count, op callbacks, the
  `_gradient_function` frame of the gradient tape, a tf.function's `_jit_compile`, the eager
  context's function library and op execution, and the collective runtime of a multi-worker run;
- `internals.typer`: the click Typer vendors.

Each has a canary test (tests/test_internals.py) that names the hook and the installed
versions when an upgrade changes it, so a release breaks loudly in one place; a test over
the rest of the package's AST (tests/test_layers.py) keeps every other module off that
surface. No module here imports TensorFlow at import time.
"""

from nanscope.internals.keras import (
    ALL_REDUCE_GRADIENTS, CLIP_GRADIENTS, LEARNING_RATE, RAW_ITERATIONS, all_reduce_gradients_hooks,
    clip_gradients_hook, compile_config, compile_loss,
    compile_metrics_built, compiled_loss_weights, compiled_output_losses, compiled_structures, flatten_layers,
    given_learning_rate, inbound_tensors, inputs_struct, keras_global_seed_generator, overridden, override,
    own_losses, raw_iterations, rebuild_train_function, replace_train_step, restore, set_keras_global_seed_generator,
    set_train_function, symbolic_build,
)
from nanscope.internals.tensorflow import (
    GRADIENT_FUNCTION, INITIALIZE_LOCAL_DEVICES, JIT_COMPILE, abort_collective_ops, configure_coordination,
    differentiated_op, execute_op, function_graph, get_config_key_value, jit_compile_of, local_devices_chosen,
    op_callback, set_config_key_value, untraced_variable,
)
from nanscope.internals.typer import usage_error

__all__ = [
    "ALL_REDUCE_GRADIENTS", "CLIP_GRADIENTS", "GRADIENT_FUNCTION", "INITIALIZE_LOCAL_DEVICES", "JIT_COMPILE",
    "LEARNING_RATE", "RAW_ITERATIONS", "abort_collective_ops", "all_reduce_gradients_hooks", "clip_gradients_hook",
    "compile_config", "compile_loss",
    "compile_metrics_built", "compiled_loss_weights", "compiled_output_losses", "compiled_structures",
    "configure_coordination", "differentiated_op", "execute_op", "flatten_layers", "function_graph",
    "get_config_key_value", "given_learning_rate", "inbound_tensors", "inputs_struct", "jit_compile_of",
    "keras_global_seed_generator", "local_devices_chosen", "op_callback", "overridden", "override", "own_losses",
    "raw_iterations", "rebuild_train_function", "replace_train_step", "restore", "set_config_key_value",
    "set_keras_global_seed_generator", "set_train_function", "symbolic_build", "untraced_variable", "usage_error",
]
