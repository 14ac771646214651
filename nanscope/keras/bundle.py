"""The repro bundle of a `fit` step: `NanScope(repro=DIR)` writes it, `nanscope replay DIR` loads it.

A bundle folder holds `model.keras` (the model as `model.save` writes it, with its
compile config: loss, optimizer, metrics), `state.npz` (the model's and the
optimizer's variables as they were BEFORE the step, and the step's batch as `fit`
gave it) and `repro.json` (`"kind": "fit"`, the step, the variables' order and
shapes, the batch's nesting, the versions, and where the user code lives: for every
class or function of the user's that the model needs, its file and qualified name,
so replay imports that file and hands it to Keras as `custom_objects`).

The folder is built beside its destination and renamed into place once complete, so
a half-written folder is never taken for a bundle. Before that, the model is loaded
back from it with the recorded code, so a bundle that exists is one that loads.
"""

import inspect
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nanscope.errors import NanscopeError, first_line
from nanscope.internals import flatten_layers

KIND = "fit"
FILES = ("repro.json", "model.keras", "state.npz")
# Modules whose classes and functions Keras finds by itself (or that hold no user code).
_LIBRARY_MODULES = ("keras", "tensorflow", "tf_keras", "numpy", "builtins", "nanscope", "functools")


class BundleError(Exception):
    """Why a repro bundle could not be written (a guest failure: a warning and a note, never fit's end)."""


def save_fit_repro(directory, model, state_before, batch, step, epoch):
    """Write the repro bundle of one `fit` step to `directory`; return its path.

    Args:
        directory: str or Path. Created; an existing bundle there is replaced.
        model: keras.Model, compiled, as fit runs it (its weights may be those after the step).
        state_before: list of np.ndarray. The model's variables, then the optimizer's, before the step.
        batch: the step's batch (eager tensors) nested as `train_step` received it.
        step, epoch: int.

    Raises:
        BundleError: the model, its loss or its code cannot be saved and loaded back; nothing is left behind.
    """
    from nanscope import __version__
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    directory = Path(directory)
    _check_destination(directory)
    objects, code = user_code(model)
    flat = tf.nest.flatten(batch)
    variables = list(model.variables) + list(model.optimizer.variables)
    if len(variables) != len(state_before):
        raise BundleError(f"the snapshot holds {len(state_before)} variables, the model and optimizer "
                          f"{len(variables)}")
    building = directory.parent / f".{directory.name}.nanscope-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        model.save(building / "model.keras")
        arrays = {f"state_{i}": _storable(value) for i, value in enumerate(state_before)}
        arrays.update({f"batch_{i}": _storable(np.asarray(t)) for i, t in enumerate(flat) if t is not None})
        np.savez(building / "state.npz", **arrays)
        document = {
            "schema": "nanscope.repro/1", "kind": KIND, "step": int(step), "epoch": epoch,
            "model": type(model).__name__, "model_variables": len(model.variables),
            "variables": [{"path": v.path, "shape": list(v.shape), "dtype": str(v.dtype)} for v in variables],
            "batch": nest_structure(batch), "user_code": code,
            "versions": {"nanscope": __version__, "tensorflow": tf.__version__, "keras": keras.__version__},
        }
        load_bundle_model(building, document, objects, arrays)  # a bundle that exists is one that loads
        (building / "repro.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        _move_into_place(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return directory


def record_run_findings(directory, recommendations):
    """Add the fit run's recommendations to the bundle's repro.json (`run_recommendations`), once the run is over.

    Some rules read the whole run (gradient growth and its clipping threshold, update ratios); a replay of one
    step cannot fire them, but `replay --verify` can try their fixes on the saved step.
    """
    from nanscope.jsonio import jsonable, write_text_atomic

    meta = Path(directory) / "repro.json"
    document = json.loads(meta.read_text(encoding="utf-8"))
    document["run_recommendations"] = jsonable([{"id": rec.id, "severity": rec.severity, "evidence": rec.evidence,
                                                 "fix": rec.fix, "data": rec.data} for rec in recommendations])
    write_text_atomic(meta, json.dumps(document, indent=2) + "\n")


def run_findings(document, meta):
    """The Recommendations repro.json's `run_recommendations` holds (the fit run's report), rebuilt."""
    from nanscope.rules.catalogue import RULES, recommend

    found = []
    for i, entry in enumerate(document.get("run_recommendations") or []):
        if not isinstance(entry, dict) or entry.get("id") not in RULES:
            raise NanscopeError(f"{meta}: run_recommendations[{i}].id: not a rule. Received: {entry!r}")
        found.append(recommend(entry["id"], entry.get("severity", "warning"), list(entry.get("evidence") or []),
                               entry.get("fix"), entry.get("data")))
    return found


def _check_destination(directory):
    if directory.exists() and (not directory.is_dir() or any(p.name not in FILES for p in directory.iterdir())):
        raise BundleError(f"{directory} exists and is not a repro bundle; nothing was written there")


def _move_into_place(building, directory):
    if directory.exists():
        for name in FILES:  # repro.json first: a folder without it is no bundle
            (directory / name).unlink(missing_ok=True)
        directory.rmdir()
    os.replace(building, directory)


def _storable(array):
    """`array` as np.savez stores it without pickling: strings as bytes, bfloat16 as float32 (exact)."""
    if array.dtype == object:
        return array.astype(bytes)
    if array.dtype.kind == "V" or "bfloat16" in str(array.dtype):
        return array.astype(np.float32)
    return array


def user_code(model):
    """({registered name: object}, [{name, module, qualname, file}]) of the user's classes and functions the model
    and its compiled loss and metrics use (Keras' own are left out).

    Raises:
        BundleError: an object that replay could not import (defined inside a function, or without a file).
    """
    from nanscope.runtime import tensorflow

    _, keras = tensorflow()
    objects, code = {}, []
    for obj in _used_objects(model):
        module = getattr(obj, "__module__", None) or ""
        if module.split(".")[0] in _LIBRARY_MODULES:
            continue
        name = keras.saving.get_registered_name(obj)
        if name in objects:
            continue
        qualname = getattr(obj, "__qualname__", obj.__name__)
        try:
            source = inspect.getsourcefile(obj)
        except TypeError:
            source = None
        if "<locals>" in qualname or source is None:
            raise BundleError(f"{qualname} (module {module}) is defined inside a function or has no source file, so "
                              "`nanscope replay` could not import it; define it at the top level of a module")
        objects[name] = obj
        code.append({"name": name, "module": module, "qualname": qualname, "file": str(Path(source).resolve())})
    return objects, code


def _used_objects(model):
    """Classes and functions that make up the model: its class, its layers' classes and what they hold (an
    activation, an initializer), the compiled loss, metrics and optimizer."""
    found = [type(model)]
    holders = [model, *flatten_layers(model), model.optimizer]
    compiled = getattr(getattr(model, "_compile_config", None), "config", None) or {}
    pending = [*compiled.values()]
    for holder in holders:
        found.append(type(holder))
        pending.extend(value for value in vars(holder).values() if callable(value))
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif inspect.isfunction(value) or inspect.isclass(value):
            found.append(value)
        elif value is not None and not isinstance(value, (str, int, float, bool)) and callable(value):
            found.append(type(value))
    return found


def nest_structure(value):
    """The nesting of a batch as JSON: {"tuple": [...]}, {"list": [...]}, {"dict": {...}}, a leaf's index, null."""
    counter = iter(range(1 << 30))
    return _structure(value, counter)


def _structure(value, counter):
    if isinstance(value, dict):
        return {"dict": {str(k): _structure(value[k], counter) for k in sorted(value)}}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [_structure(v, counter) for v in value]}
    return None if value is None else next(counter)


def packed(structure, leaves):
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


@dataclass
class FitBundle:
    """A loaded fit bundle: the compiled model with the state before the step put back, and the batch.

    Args:
        model: keras.Model.
        batch: the step's batch, nested as `train_step` received it (eager tensors).
        document: dict. repro.json.
        state: list of np.ndarray. The state before the step (model, then optimizer variables).
    """

    model: object
    batch: object
    document: dict
    state: list

    def restore(self):
        """Put the state before the step back into the model and the optimizer."""
        from nanscope.runtime import tensorflow

        tf, _ = tensorflow()
        for variable, value in zip(state_variables(self.model), self.state):
            variable.assign(tf.cast(value, variable.dtype))


def state_variables(model):
    """The model's variables, then its optimizer's: the order of `state.npz`."""
    return list(model.variables) + list(model.optimizer.variables)


def load_fit_repro(directory, document, arrays):
    """The FitBundle of a fit bundle folder whose repro.json and state.npz are read (`forensics.repro.load_repro`).

    Raises:
        NanscopeError: a field of repro.json is missing or wrong, a user file is gone, or the model does not load.
    """
    directory = Path(directory)
    meta = directory / "repro.json"
    objects = import_user_code(meta, _field(document, meta, "user_code", list))
    model = load_bundle_model(directory, document, objects, arrays, error=NanscopeError)
    return FitBundle(model, _batch(document, arrays, meta), document,
                     [arrays[f"state_{i}"] for i in range(len(document["variables"]))])


def load_bundle_model(directory, document, objects, arrays, error=BundleError):
    """Load `model.keras` with the user's code, ready for a step (optimizer built), checked against the recorded
    variables; the state before the step is put back."""
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    path = Path(directory) / "model.keras"
    if not path.is_file():
        raise error(f"{directory}: not a fit repro bundle: model.keras is missing")
    try:
        model = keras.saving.load_model(path, custom_objects=objects, compile=True)
    except Exception as exc:
        raise error(f"{path}: the model does not load back: {type(exc).__name__}: {first_line(exc)}") from exc
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


def import_user_code(meta, code):
    """{registered name: object} from the files repro.json's `user_code` names (each file imported once)."""
    from nanscope.factory import load_module_file

    modules, objects = {}, {}
    for i, entry in enumerate(code):
        field = f"{meta}: user_code[{i}]"
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k), str) for k in ("name", "qualname", "file")):
            raise NanscopeError(f"{field}: expected name, qualname and file. Received: {entry!r}")
        path = Path(entry["file"])
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


def _batch(document, arrays, meta):
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    structure = _field(document, meta, "batch", (dict, int, type(None)))
    leaves = {}
    for key, value in arrays.items():
        if key.startswith("batch_"):
            leaves[int(key.removeprefix("batch_"))] = tf.constant(value)
    try:
        return packed(structure, leaves)
    except (KeyError, TypeError, AttributeError) as exc:
        raise NanscopeError(f"{meta}: `batch` does not match the arrays in state.npz ({exc!r})") from exc


def _field(document, meta, name, kind):
    value = document.get(name)
    if not isinstance(value, kind):
        raise NanscopeError(f"{meta}: `{name}` is missing or of the wrong type. Received: {name}={value!r}")
    return value
