"""Load the model a spec names: a Python factory, a `.keras` file or a SavedModel.

Everything ends as a `LoadedModel`: something callable on a batch, its trainable
variables, and (for Keras models) its layers, so the step engine can train and
probe any of them the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from collections.abc import Callable

from nanscope.data import inputs
from nanscope.errors import DataError, ModelError, first_line
from nanscope.model.factory import call_factory, load_callable
from nanscope.internals import compiled_loss_weights
from nanscope.runtime import tensorflow
from nanscope.tf_types import KerasModel, Tensor

if TYPE_CHECKING:
    from nanscope.spec.sections import RunSpec



class ModelCall(Protocol):
    """`call(x, training)`: the model's output on a batch `x`."""

    def __call__(self, x: Any, training: bool) -> Tensor: ...


@dataclass
class LoadedModel:
    """A trainable model, whatever it was loaded from.

    Args:
        kind: str. "keras" or "saved_model".
        description: str. One line for the report header.
        keras_model: keras.Model or None. Set for Keras models (per-layer statistics available).
        module: object or None. The restored SavedModel object.
        call: callable(x, training) -> y_pred.
        trainable_variables: list of tf.Variable.
        variables: list of tf.Variable. All state that a step may change (trainable and not).
        compiled_loss: the compiled model's loss, if any.
        compiled_optimizer: the compiled model's optimizer, if any.
        compiled_loss_weights: the compiled model's loss_weights (per output), if any.
    """

    kind: str
    description: str
    call: ModelCall
    trainable_variables: list[Any]
    variables: list[Any]
    keras_model: Any = None
    module: Any = None
    compiled_loss: Any = None
    compiled_optimizer: Any = None
    compiled_loss_weights: Any = None
    notes: list[str] = field(default_factory=list)

    @property
    def param_count(self) -> int:
        return int(sum(int(v.shape.num_elements() or 0) for v in self.trainable_variables))


def load_model(spec: RunSpec, unsafe: bool = False) -> LoadedModel:
    """Build or load the model of a RunSpec; seeds must be set before calling.

    Raises:
        ModelError: naming the file and field when the model cannot be loaded.
    """
    tensorflow()
    if spec.model.factory is not None:
        return _from_factory(spec, spec.model.factory)
    assert spec.model.path is not None  # ModelSpec holds exactly one of factory and path
    path = spec.resolve(spec.model.path)
    if not path.exists():
        raise ModelError(f"{spec.source}: model.path: file not found: {path}")
    if path.is_dir():
        return _from_saved_model(spec, path)
    if path.suffix == ".keras":
        return _from_keras_file(spec, path, unsafe)
    raise ModelError(
        f"{spec.source}: model.path: {path.name} is neither a .keras file nor a SavedModel directory"
    )


def _from_factory(spec: RunSpec, factory: str) -> LoadedModel:
    _, keras = tensorflow()
    where = f"{spec.source}: model.factory"
    function = load_callable(factory, spec.base_dir, where, ModelError)
    model = call_factory(function, spec.model.args, where, ModelError)
    if not isinstance(model, keras.Model):
        raise ModelError(f"{where}: {factory} must return a keras.Model. Received: a {type(model).__name__}")
    return from_keras(model, f"{factory}{_args_suffix(spec.model.args)}")


def _from_keras_file(spec: RunSpec, path: Path, unsafe: bool) -> LoadedModel:
    _, keras = tensorflow()
    try:
        model = keras.saving.load_model(str(path), safe_mode=not unsafe)
    except ValueError as exc:
        if "safe_mode" in str(exc) or "unsafe" in str(exc).lower() or "lambda" in str(exc).lower():
            raise ModelError(
                f"{spec.source}: model.path: {path.name} needs unsafe deserialization (e.g. a Lambda layer); "
                "pass --unsafe only if you trust the file"
            ) from exc
        raise ModelError(f"{spec.source}: model.path: cannot load {path.name}: {first_line(exc)}") from exc
    except Exception as exc:
        raise ModelError(f"{spec.source}: model.path: cannot load {path.name}: {first_line(exc)}") from exc
    return from_keras(model, path.name)


def from_keras(model: KerasModel, description: str) -> LoadedModel:
    """A LoadedModel of a Keras model, with what its compile() set (loss, optimizer, loss weights).

    Args:
        model: keras.Model.
        description: str. The report header's name for it (the factory or the file).
    """
    compiled = getattr(model, "compiled", False) or getattr(model, "optimizer", None) is not None
    return LoadedModel(
        kind="keras",
        description=f"{description} ({type(model).__name__})",
        call=lambda x, training: model(x, training=training),
        trainable_variables=list(model.trainable_variables),
        variables=list(model.variables),
        keras_model=model,
        compiled_loss=getattr(model, "loss", None) if compiled else None,
        compiled_optimizer=getattr(model, "optimizer", None) if compiled else None,
        compiled_loss_weights=compiled_loss_weights(model) if compiled else None,
    )


def build_model(model: LoadedModel, sample_x: Any, source: str | None = None) -> Tensor:
    """Call the model once on one row so its variables exist, and return the output.

    A shape that does not fit is bad input, reported against `data` of the spec file `source`.
    """
    keras_model = model.keras_model
    try:
        if keras_model is not None:
            return keras_model(inputs.take(sample_x, slice(0, 1)), training=False)
        return model.call(sample_x, training=False)  # a SavedModel's signature may fix the batch size
    except Exception as exc:
        expected = _expected_input(keras_model) if keras_model is not None else None
        raise DataError(
            (f"{source}: " if source else "")
            + f"data: input of shape {_row_shapes(sample_x)} (per row) does not fit the model"
            + (f", which expects {expected}" if expected else "")
            + f": {first_line(exc)}"
        ) from exc


def _row_shapes(x: Any) -> tuple[int, ...] | str:
    """The shape of one row, as the message shows it: (3,) for one input, {tokens: (3,), ...} or [(3,), ...]."""
    shapes = inputs.row_shapes(x)
    if isinstance(shapes, dict):  # only a mapping of inputs gives one
        return "{" + ", ".join(f"{k}: {tuple(v)}" for k, v in shapes.items()) + "}"
    if not inputs.is_multi(x):
        return tuple(shapes)
    return "[" + ", ".join(str(tuple(v)) for v in shapes) + "]"


def _expected_input(keras_model: KerasModel) -> Any:
    try:
        shape = keras_model.input_shape
        return tuple(shape[1:]) if isinstance(shape, tuple) else shape
    except Exception:
        return None


def _from_saved_model(spec: RunSpec, path: Path) -> LoadedModel:
    tf, _ = tensorflow()
    if not (path / "saved_model.pb").exists() and not (path / "saved_model.pbtxt").exists():
        raise ModelError(f"{spec.source}: model.path: {path} is a directory but not a SavedModel (no saved_model.pb)")
    try:
        module = tf.saved_model.load(str(path))
    except Exception as exc:
        raise ModelError(f"{spec.source}: model.path: cannot load SavedModel {path}: {first_line(exc)}") from exc
    call = _serving_call(module)
    if call is None:
        raise ModelError(
            f"{spec.source}: model.path: SavedModel {path.name} has no `serve` or `__call__` function to train through"
        )
    trainable = list(getattr(module, "trainable_variables", []) or [])
    if not trainable:
        raise ModelError(f"{spec.source}: model.path: SavedModel {path.name} tracks no trainable variables")
    return LoadedModel(
        kind="saved_model",
        description=f"{path.name} (SavedModel)",
        call=call,
        trainable_variables=trainable,
        variables=list(getattr(module, "variables", trainable)),
        module=module,
        notes=["SavedModel: no Keras layers, so statistics are grouped by variable name"],
    )


def _serving_call(module: Any) -> ModelCall | None:
    for name in ("serve", "__call__"):
        function = getattr(module, name, None)
        if callable(function):

            def call(x: Any, training: bool, fn: Callable[[Any], Any] = function) -> Any:
                del training  # Unused: a SavedModel's serving function has no training mode
                return fn(x)

            return call
    signatures = getattr(module, "signatures", {})
    if "serving_default" in signatures:
        signature = signatures["serving_default"]

        def call(x: Any, training: bool, fn: Callable[[Any], Any] = signature) -> Any:
            del training  # Unused: a SavedModel's serving function has no training mode
            outputs = fn(x)
            return next(iter(outputs.values())) if isinstance(outputs, dict) else outputs

        return call
    return None


def _args_suffix(args: dict[str, Any]) -> str:
    return f"({', '.join(f'{k}={v!r}' for k, v in args.items())})" if args else "()"



def output_names(model: LoadedModel, output: Any) -> list[str]:
    """Names of a model's outputs, in the order `tf.nest.flatten` gives them.

    A dict output is named by its keys (paths for nested ones); a list of outputs by
    the Keras model's `output_names` when they fit, else `output_0`, `output_1`, ...

    Args:
        model: LoadedModel.
        output: the model's output on a sample batch.
    """
    tf, _ = tensorflow()
    if isinstance(output, dict):
        return _paths(output, "")
    count = len(tf.nest.flatten(output))
    names = list(getattr(model.keras_model, "output_names", None) or [])
    if len(names) == count and len(set(names)) == count:
        return names
    return ["output"] if count == 1 else [f"output_{i}" for i in range(count)]


def _paths(structure: Any, prefix: str) -> list[str]:
    """"a/b"-style paths of the leaves of a nested output, in `tf.nest.flatten` order (dict keys sorted)."""
    if isinstance(structure, dict):
        items = sorted(structure.items())
    elif isinstance(structure, (list, tuple)):
        items = list(enumerate(structure))
    else:
        return [prefix]
    return [path for key, value in items for path in _paths(value, f"{prefix}/{key}" if prefix else str(key))]
