"""Load a fit repro bundle back (`nanscope.keras.bundle` writes it): the model with the user's code, the state
before the step, the batch, and the run's findings.

Every field read from repro.json is checked where it is read; a bad one is a `NanscopeError` naming the file
and the field (exit 2).
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.errors import NanscopeError, first_line
from nanscope.tf_types import Batch, KerasModel, Variable

if TYPE_CHECKING:
    from nanscope.rules.rule import Recommendation

# A Keras model, its variables and a batch as `train_step` received it (eager tensors, nested): Keras and TensorFlow


class BundleError(Exception):
    """Why a repro bundle could not be written (a guest failure: a warning and a note, never fit's end)."""


@dataclass
class FitBundle:
    """A loaded fit bundle: the compiled model with the state before the step put back, and the batch.

    Args:
        model: keras.Model.
        batch: the step's batch, nested as `train_step` received it (eager tensors).
        document: dict. repro.json.
        state: list of np.ndarray. The state before the step (model, then optimizer variables).
    """

    model: KerasModel
    batch: Batch
    document: dict[str, Any]
    state: list[np.ndarray]

    def restore(self) -> None:
        """Put the state before the step back into the model and the optimizer."""
        from nanscope.runtime import tensorflow

        tf, _ = tensorflow()
        for variable, value in zip(state_variables(self.model), self.state):
            variable.assign(tf.cast(value, variable.dtype))


def state_variables(model: KerasModel) -> list[Variable]:
    """The model's variables, then its optimizer's: the order of `state.npz`."""
    return list(model.variables) + list(model.optimizer.variables)


def load_fit_repro(directory: str | os.PathLike[str], document: dict[str, Any], arrays: Mapping[str, np.ndarray],
                   unsafe: bool = False) -> FitBundle:
    """The FitBundle of a fit bundle folder whose repro.json and state.npz are read (`forensics.repro.load_repro`);
    `unsafe` loads a model that needs Keras' unsafe deserialization (a Lambda layer runs stored Python code).

    Raises:
        NanscopeError: a field of repro.json is missing or wrong, a user file is gone, or the model does not load.
    """
    directory = Path(directory)
    meta = directory / "repro.json"
    objects = import_user_code(meta, _field(document, meta, "user_code", list))
    model = load_bundle_model(directory, document, objects, arrays, error=NanscopeError, unsafe=unsafe)
    return FitBundle(model, _batch(document, arrays, meta), document,
                     [arrays[f"state_{i}"] for i in range(len(document["variables"]))])


def load_bundle_model(directory: str | os.PathLike[str], document: dict[str, Any], objects: dict[str, Any],
                      arrays: Mapping[str, np.ndarray], error: type[Exception] = BundleError,
                      unsafe: bool = False) -> KerasModel:
    """Load `model.keras` with the user's code, ready for a step (optimizer built), checked against the recorded
    variables; the state before the step is put back."""
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    path = Path(directory) / "model.keras"
    if not path.is_file():
        raise error(f"{directory}: not a fit repro bundle: model.keras is missing")
    policy = keras.config.dtype_policy()
    try:
        # compile() wraps the optimizer in a LossScaleOptimizer when the model's policy is mixed_float16; that
        # policy is the global one the model was built under, so loading takes it on for as long as it runs.
        keras.config.set_dtype_policy(document.get("dtype_policy") or policy)
        model = keras.saving.load_model(path, custom_objects=objects, compile=True, safe_mode=not unsafe)
    except ValueError as exc:
        if not unsafe and "safe_mode" in str(exc):
            raise error(f"{path}: the model needs unsafe deserialization (a Lambda layer runs stored Python code); "
                        "pass --unsafe only if you trust the bundle") from exc
        raise error(f"{path}: the model does not load back: {type(exc).__name__}: {first_line(exc)}") from exc
    except Exception as exc:
        raise error(f"{path}: the model does not load back: {type(exc).__name__}: {first_line(exc)}") from exc
    finally:
        keras.config.set_dtype_policy(policy)
    if model.optimizer is None:
        raise error(f"{path}: the model was saved without its compiled optimizer")
    recorded = _field(document, Path(directory) / "repro.json", "variables", list)
    variables = state_variables(model)
    shapes = [list(v.shape) for v in variables]
    if shapes != [entry.get("shape") for entry in recorded]:
        raise error(f"{Path(directory) / 'repro.json'}: `variables`: the bundle records {len(recorded)} variables, "
                    f"the loaded model and optimizer have {len(variables)} of other shapes")
    for i, variable in enumerate(variables):
        key = f"state_{i}"
        if key not in arrays:
            raise error(f"{Path(directory) / 'state.npz'}: `{key}` is missing")
        variable.assign(tf.cast(arrays[key], variable.dtype))
    return model


def import_user_code(meta: Path, code: list[Any]) -> dict[str, Any]:
    """{registered name: object} from the files repro.json's `user_code` names (each file imported once): the
    copies inside the bundle, relative to it (an older bundle's absolute paths are read as they are)."""
    from nanscope.model.factory import load_module_file
    from nanscope.forensics.bundle_code import in_bundle

    modules: dict[Path, Any] = {}
    objects: dict[str, Any] = {}
    for i, entry in enumerate(code):
        field = f"{meta}: user_code[{i}]"
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("name", "qualname", "file")):
            raise NanscopeError(f"{field}: expected name, qualname and file. Received: {entry!r}")
        path = in_bundle(meta.parent, entry["file"])
        if not path.is_file():
            raise NanscopeError(f"{field}.file: file not found: {path} (it held {entry['qualname']})")
        if path not in modules:
            modules[path] = load_module_file(path, f"{field}.file")
        obj = modules[path]
        for part in entry["qualname"].split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                raise NanscopeError(f"{field}.qualname: {path} no longer defines {entry['qualname']}")
        objects[entry["name"]] = obj
    return objects


def _batch(document: dict[str, Any], arrays: Mapping[str, np.ndarray], meta: Path) -> Batch:
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    structure = _field(document, meta, "batch", (dict, int, type(None)))
    leaves: dict[int, Any] = {}
    for key, value in arrays.items():
        if key.startswith("batch_"):
            leaves[int(key.removeprefix("batch_"))] = tf.constant(value)
    try:
        return packed(structure, leaves)
    except (KeyError, TypeError, AttributeError) as exc:
        raise NanscopeError(f"{meta}: `batch` does not match the arrays in state.npz ({exc!r})") from exc


def _field(document: dict[str, Any], meta: Path, name: str, kind: type | tuple[type, ...]) -> Any:
    value = document.get(name)
    if not isinstance(value, kind):
        raise NanscopeError(f"{meta}: `{name}` is missing or of the wrong type. Received: {name}={value!r}")
    return value


def run_findings(document: dict[str, Any], meta: Path) -> list["Recommendation"]:
    """The Recommendations repro.json's `run_recommendations` holds (the fit run's report), rebuilt."""
    from nanscope.rules.catalogue import RULES, recommend

    found = []
    for i, entry in enumerate(document.get("run_recommendations") or []):
        if not isinstance(entry, dict) or entry.get("id") not in RULES:
            raise NanscopeError(f"{meta}: run_recommendations[{i}].id: not a rule. Received: {entry!r}")
        found.append(recommend(entry["id"], entry.get("severity", "warning"), list(entry.get("evidence") or []),
                               entry.get("fix"), entry.get("data")))
    return found


def packed(structure: Any, leaves: Mapping[int, Any]) -> Batch:
    """The batch rebuilt from `nest_structure`'s JSON and its leaves (eager tensors), in flattened order."""
    if structure is None:
        return None
    if isinstance(structure, int):
        return leaves[structure]
    if "dict" in structure:
        return {k: packed(v, leaves) for k, v in structure["dict"].items()}
    kind = "tuple" if "tuple" in structure else "list"
    parts = [packed(v, leaves) for v in structure[kind]]
    return tuple(parts) if kind == "tuple" else parts
