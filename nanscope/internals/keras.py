"""Keras' private surface: the private attributes nanscope reads or wraps, and `keras.src` imports.

Keras' CompileLoss (`_compile_loss`, its `_flat_losses`, `_user_loss_weights` and build
structures), `Layer._flatten_layers` and `_get_own_losses`, the optimizer's
`_clip_gradients`, `_learning_rate` and `_iterations`, the functional graph's
`_inputs_struct` and `_inbound_nodes`, the global SeedGenerator, and the surgery on a
model's train step (`train_step`, `train_function`, `make_train_function(force=True)`).

Hooks are attached by overriding an attribute on the instance (`overridden`),
which bypasses Keras' attribute tracking, and always restored as they were found.
"""

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

_MISSING = object()

# Keras models, layers, optimizers and their attributes: Keras ships no types (Any to mypy).
# A hook: (owner, attribute name, wrap), `owner.name` becoming `wrap(owner.name)`.
Hook = tuple[Any, str, Callable[[Any], Any]]
# What `override` returns and `restore` takes: (owner, name, the previous instance attribute or _MISSING).
Saved = tuple[Any, str, Any]


def override(owner: Any, name: str, value: Any) -> Saved:
    """Set `name` on the instance `owner` (past Keras' attribute tracking); return what `restore` needs."""
    previous = owner.__dict__.get(name, _MISSING)
    object.__setattr__(owner, name, value)
    return owner, name, previous


def restore(saved: Saved) -> None:
    """Undo one `override`: put the instance attribute back, or remove it when there was none."""
    owner, name, previous = saved
    if previous is _MISSING:
        object.__delattr__(owner, name)
    else:
        object.__setattr__(owner, name, previous)


@contextlib.contextmanager
def overridden(hooks: Iterable[Hook]) -> Iterator[None]:
    """Wrap attributes for the block and always restore them, even when the block raises.

    Args:
        hooks: iterable of (owner, name, wrap). `owner.name` becomes `wrap(owner.name)`.
    """
    saved: list[Saved] = []
    try:
        for owner, name, wrap in hooks:
            saved.append(override(owner, name, wrap(getattr(owner, name))))
        yield
    finally:
        for one in reversed(saved):
            restore(one)


# --- Keras: the model's layers and the losses they own ------------------------------------------------


def flatten_layers(model: Any) -> list[Any]:
    """Every layer of `model`, nested ones included, the model itself excluded (Keras' `_flatten_layers`)."""
    return list(model._flatten_layers(include_self=False, recursive=True))


def symbolic_build(model: Any, element_spec: Any) -> None:
    """Build an unbuilt model, its compiled loss and metrics and its optimizer from a batch's TensorSpecs, as
    `fit` does under a distribution strategy (`Trainer._symbolic_build`): no step runs."""
    model._symbolic_build(data_batch=element_spec)


def compile_metrics_built(model: Any) -> bool:
    """True when the model's compiled metrics exist as variables (`_compile_metrics.built`); Keras builds them in
    the first traced step, so before it `model.metrics_variables` lacks them."""
    metrics = getattr(model, "_compile_metrics", None)
    return metrics is None or bool(metrics.built)


def own_losses(layer: Any, regularizers: bool = True) -> list[Any]:
    """The loss terms `layer` itself owns: its `add_loss` terms (`_get_own_losses`) and, with `regularizers`,
    its weight regularizers applied to its own variables (`_trainable_variables`)."""
    own = list(layer._get_own_losses())
    if regularizers:
        own += [v.regularizer(v) for v in getattr(layer, "_trainable_variables", [])
                if getattr(v, "regularizer", None)]
    return own


# --- Keras: the compiled loss (CompileLoss) -----------------------------------------------------------


def compile_loss(model: Any) -> Any:
    """The model's CompileLoss (`_compile_loss`), or None before compile() or for a model without one."""
    return getattr(model, "_compile_loss", None)


def compiled_loss_weights(model: Any) -> Any:
    """`compile(loss_weights=...)` as the model was given it: Keras keeps it only on its CompileLoss."""
    return getattr(compile_loss(model), "_user_loss_weights", None)


def compiled_output_losses(model: Any) -> list[Any]:
    """One entry per output loss of the compiled model, once built (`CompileLoss._flat_losses`); [] before.

    Each entry has `name`, `path` (where its target and prediction sit), `loss` and `loss_weights`.
    """
    return list(getattr(compile_loss(model), "_flat_losses", None) or [])


def compiled_structures(model: Any) -> tuple[Any, Any]:
    """(y_true structure, y_pred structure) the CompileLoss was built on (`_y_true_build_structure`, ...)."""
    built = compile_loss(model)
    return built._y_true_build_structure, built._y_pred_build_structure


# --- Keras: the optimizer ------------------------------------------------------------------------------

# The optimizer method that applies clipnorm / global_clipnorm / clipvalue to the gradients
# (keras/src/optimizers/base_optimizer.py); the callback wraps it to see the clipped gradients.
CLIP_GRADIENTS = "_clip_gradients"


def clip_gradients_hook(optimizer: Any, wrap: Callable[[Any], Any]) -> Hook:
    """The `overridden` entry that wraps the optimizer's clipping step with `wrap`."""
    return optimizer, CLIP_GRADIENTS, wrap


# The TensorFlow backend optimizer's sum of every replica's gradients under tf.distribute
# (keras/src/backend/tensorflow/optimizer.py: a list of (grad, variable) pairs in, the pairs with the
# summed gradients out); the callback takes the sums Keras makes instead of summing the same
# gradients once more.
ALL_REDUCE_GRADIENTS = "_all_reduce_sum_gradients"


def all_reduce_gradients_hooks(optimizer: Any, wrap: Callable[[Any], Any]) -> list[Hook]:
    """The `overridden` entries that wrap the optimizer's all-reduce of the replicas' gradients with `wrap`:
    none for an optimizer without one."""
    own = callable(getattr(optimizer, ALL_REDUCE_GRADIENTS, None))
    return [(optimizer, ALL_REDUCE_GRADIENTS, wrap)] if own else []


# The optimizer's learning rate as given (a float variable, a LearningRateSchedule or a callable) and
# its raw step counter (keras/src/optimizers/base_optimizer.py): the public `learning_rate` is only
# the value now, and the public `iterations` is divided by `gradient_accumulation_steps`, while a
# schedule is evaluated at the raw counter.
LEARNING_RATE = "_learning_rate"
RAW_ITERATIONS = "_iterations"


def given_learning_rate(optimizer: Any) -> Any:
    """What the optimizer was given as its learning rate: a variable, a LearningRateSchedule or a callable."""
    return getattr(optimizer, LEARNING_RATE)


def raw_iterations(optimizer: Any) -> int:
    """The optimizer's step counter as a schedule reads it (every apply, gradient accumulation included)."""
    counter = getattr(optimizer, RAW_ITERATIONS, None)
    if counter is None:  # Keras < 3.4 (3.3.3, the oldest supported): the public `iterations` is the raw counter
        counter = optimizer.iterations
    return int(counter.numpy())


# --- Keras: the model's train step, replaced for the length of a fit ------------------------------------
# `fit` calls the model's `train_function`, which `make_train_function` builds around `train_step`
# (keras/src/backend/tensorflow/trainer.py). The NanScope callback puts its own step in (an instance
# attribute, so the class's is untouched), rebuilds the function around it, wraps the function, and puts
# both back as they were found.


def replace_train_step(model: Any, step: Callable[..., Any]) -> Saved:
    """Make `step` the model's `train_step` (on the instance); return what `restore` needs to put it back."""
    return override(model, "train_step", step)


def rebuild_train_function(model: Any) -> Any:
    """Build the model's train function again around its current `train_step` (`make_train_function(force=True)`,
    as fit does on its first call); return it."""
    model.make_train_function(force=True)
    return model.train_function


def set_train_function(model: Any, function: Any) -> None:
    """Make `function(iterator) -> logs` what fit calls for each execution (`model.train_function`)."""
    model.train_function = function


def compile_config(model: Any) -> dict[str, Any]:
    """The arguments `compile` was given (loss, metrics, optimizer, ...) as a dict, from the model's
    `_compile_config`; {} for a model never compiled."""
    return getattr(getattr(model, "_compile_config", None), "config", None) or {}


# --- Keras: the functional graph ------------------------------------------------------------------------


def inputs_struct(model: Any) -> Any:
    """The structure the model's inputs were declared in (`_inputs_struct`): a dict for named inputs, else None."""
    return getattr(model, "_inputs_struct", None)


def inbound_tensors(layer: Any) -> list[Any]:
    """The tensors fed to `layer` in the functional graph, over all its calls (`_inbound_nodes`)."""
    return [tensor for node in getattr(layer, "_inbound_nodes", []) for tensor in getattr(node, "input_tensors", [])]


# --- Keras and TensorFlow: the global random state an unseeded random op draws from ------------------


def keras_global_seed_generator() -> Any:
    """The SeedGenerator an unseeded `keras.random.*` call draws from (`global_seed_generator`), or None
    before the first such call creates it."""
    from keras.src.backend.common import global_state

    return global_state.get_global_attribute(_global_seed_generator_key())


def set_keras_global_seed_generator(generator: Any) -> None:
    """Put back the global SeedGenerator as it was found (None: the next unseeded call creates one)."""
    from keras.src.backend.common import global_state

    global_state.set_global_attribute(_global_seed_generator_key(), generator)


def _global_seed_generator_key() -> str:
    """The global-state key of that SeedGenerator: a named constant since Keras 3.4, the literal before (3.3.3)."""
    from keras.src.random import seed_generator

    return getattr(seed_generator, "GLOBAL_SEED_GENERATOR", "global_seed_generator")

