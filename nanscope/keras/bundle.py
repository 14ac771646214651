"""The repro bundle of a `fit` step: `NanScope(repro=DIR)` writes it (here), `nanscope replay DIR` loads it
(`bundle_load`).

A bundle folder holds `model.keras` (the model as `model.save` writes it, with its
compile config: loss, optimizer, metrics), `state.npz` (the model's and the
optimizer's variables as they were BEFORE the step, and the step's batch as `fit`
gave it) and `repro.json` (`"kind": "fit"`, the step, the variables' order and
shapes, the batch's nesting, the versions, and the user code: for every class or
function of the user's that the model needs, its qualified name, its copy under
`code/` and the name of the file it came from (`forensics.bundle_code`), so replay
imports the copy and hands it to Keras as `custom_objects`, and the folder replays
on another machine without the user's files).

The folder is built beside its destination and renamed into place once complete, so
a half-written folder is never taken for a bundle. Before that, the model is loaded
back from it with the recorded code, so a bundle that exists is one that loads.
"""

import inspect
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.forensics.bundle_code import CODE_DIR, copy_code, named_by_origin, origin_name
from nanscope.internals import compile_config, flatten_layers
from nanscope.keras.bundle_load import BundleError, load_bundle_model
from nanscope.tf_types import Batch, KerasModel

if TYPE_CHECKING:
    from nanscope.rules.rule import Recommendation


KIND = "fit"
FILES = ("repro.json", "model.keras", "state.npz", CODE_DIR)
# Modules whose classes and functions Keras finds by itself (or that hold no user code).
_LIBRARY_MODULES = ("keras", "tensorflow", "tf_keras", "numpy", "builtins", "nanscope", "functools")


def save_fit_repro(directory: str | os.PathLike[str], model: KerasModel, state_before: Sequence[np.ndarray],
                   batch: Batch, step: int, epoch: int) -> list[dict[str, Any]]:
    """Write the repro bundle of one `fit` step to `directory`; return the user code it records (`user_code`).

    Args:
        directory: str or Path. Created; an existing bundle there is replaced.
        model: keras.Model, compiled, as fit runs it (its weights may be those after the step).
        state_before: list of np.ndarray. The model's variables, then the optimizer's, before the step.
        batch: the step's batch (eager tensors) nested as `train_step` received it.
        step, epoch: int.

    Raises:
        BundleError: the model, its loss or its code cannot be saved and loaded back; nothing is left behind.
    """
    from nanscope.runtime import VERSION, tensorflow

    tf, keras = tensorflow()
    directory = Path(directory)
    _check_destination(directory)
    objects, sources = user_code(model)
    flat = tf.nest.flatten(batch)
    variables = list(model.variables) + list(model.optimizer.variables)
    if len(variables) != len(state_before):
        raise BundleError(f"the snapshot holds {len(state_before)} variables, the model and optimizer "
                          f"{len(variables)}")
    building = directory.parent / f".{directory.name}.nanscope-{os.getpid()}"
    shutil.rmtree(building, ignore_errors=True)
    building.mkdir(parents=True)
    try:
        code, files = bundled_code(sources, building)
        model.save(building / "model.keras")
        # Any to mypy: numpy's stubs read `**arrays` as possibly holding savez's `allow_pickle`; no name here is that.
        arrays: dict[str, Any] = {f"state_{i}": _storable(value) for i, value in enumerate(state_before)}
        arrays.update({f"batch_{i}": _storable(np.asarray(t)) for i, t in enumerate(flat) if t is not None})
        np.savez(building / "state.npz", **arrays)
        document = {
            "schema": "nanscope.repro/1", "kind": KIND, "step": int(step), "epoch": epoch,
            "model": type(model).__name__, "model_variables": len(model.variables),
            "dtype_policy": model.dtype_policy.name,
            "variables": [{"path": v.path, "shape": list(v.shape), "dtype": str(v.dtype)} for v in variables],
            "batch": nest_structure(batch), "user_code": code, "code_files": files,
            "versions": {"nanscope": VERSION, "tensorflow": tf.__version__, "keras": keras.__version__},
        }
        # A bundle that exists is one that loads: the model just saved from this process, so a Lambda layer's code
        # is the user's own (replay asks for --unsafe before it runs such code from a bundle).
        load_bundle_model(building, document, objects, arrays, unsafe=True)
        (building / "repro.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
        _move_into_place(building, directory)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return code


def record_run_findings(directory: str | os.PathLike[str], recommendations: Iterable["Recommendation"]) -> None:
    """Add the fit run's recommendations to the bundle's repro.json (`run_recommendations`), once the run is over.

    Some rules read the whole run (gradient growth and its clipping threshold, update ratios); a replay of one
    step cannot fire them, but `replay --verify` can try their fixes on the saved step.
    """
    from nanscope.jsonio import jsonable, write_text_atomic

    meta = Path(directory) / "repro.json"
    document = json.loads(meta.read_text(encoding="utf-8"))
    origins = [entry["origin"] for entry in document.get("code_files") or []]
    document["run_recommendations"] = named_by_origin(jsonable([
        {"id": rec.id, "severity": rec.severity, "evidence": rec.evidence, "fix": rec.fix, "data": rec.data}
        for rec in recommendations]), origins)
    write_text_atomic(meta, json.dumps(document, indent=2) + "\n")


def _check_destination(directory: Path) -> None:
    if directory.exists() and (not directory.is_dir() or any(p.name not in FILES for p in directory.iterdir())):
        raise BundleError(f"{directory} exists and is not a repro bundle; nothing was written there")


def _move_into_place(building: Path, directory: Path) -> None:
    if directory.exists():
        for name in FILES:  # repro.json first: a folder without it is no bundle
            if (directory / name).is_dir():
                shutil.rmtree(directory / name)
            else:
                (directory / name).unlink(missing_ok=True)
        directory.rmdir()
    os.replace(building, directory)


def _storable(array: np.ndarray) -> np.ndarray:
    """`array` as np.savez stores it without pickling: strings as bytes, bfloat16 as float32 (exact)."""
    if array.dtype == object:
        return array.astype(bytes)
    if array.dtype.kind == "V" or "bfloat16" in str(array.dtype):
        return array.astype(np.float32)
    return array


def bundled_code(sources: Sequence[dict[str, Any]], folder: str | os.PathLike[str]
                 ) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Copy the user files `sources` names (and the files they import) into `folder`/code.

    Returns:
        (user_code, code_files): `sources`' entries with `file` the copy, relative to the bundle, and `origin` the
        name a reader finds in their project (`forensics.bundle_code.origin_name`); and every copy as
        {file, origin}.
    """
    copies = copy_code([entry["file"] for entry in sources], folder)
    files = [{"file": copy, "origin": origin_name(path)} for path, copy in copies.items()]
    return [{**entry, "file": copies[Path(entry["file"]).resolve()], "origin": origin_name(entry["file"])}
            for entry in sources], files


def user_code(model: KerasModel) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """({registered name: object}, [{name, module, qualname, file}]) of the user's classes and functions the model
    and its compiled loss and metrics use (Keras' own are left out); `file` is the absolute path of its source.

    Raises:
        BundleError: an object that replay could not import (defined inside a function, or without a file).
    """
    from nanscope.runtime import tensorflow

    _, keras = tensorflow()
    objects: dict[str, Any] = {}
    code: list[dict[str, Any]] = []
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


def _used_objects(model: KerasModel) -> list[Any]:
    """Classes and functions that make up the model: its class, its layers' classes and what they hold (an
    activation, an initializer), the compiled loss, metrics and optimizer."""
    found = [type(model)]
    holders = [model, *flatten_layers(model), model.optimizer]
    compiled = compile_config(model)
    pending = [*compiled.values()]
    from nanscope.runtime import tensorflow

    lambda_layer = tensorflow()[1].layers.Lambda
    for holder in holders:
        found.append(type(holder))
        # A Lambda layer's function is saved by Keras as its bytecode (loading it needs --unsafe), not imported.
        pending.extend(value for key, value in vars(holder).items()
                       if callable(value) and not (isinstance(holder, lambda_layer) and key == "function"))
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
        elif inspect.ismethod(_unwrapped(value)):
            continue  # a layer's own method (Keras wraps `build` on the instance): its class is recorded
        elif inspect.isfunction(value) or inspect.isclass(value):
            found.append(_unwrapped(value))
        elif value is not None and not isinstance(value, (str, int, float, bool)) and callable(value):
            found.append(type(value))
    return found


def _unwrapped(value: Any) -> Any:
    """What a `functools.wraps` wrapper wraps (Keras' `build_wrapper` takes the user's name but is Keras' code)."""
    try:
        return inspect.unwrap(value)
    except ValueError:  # a cycle of __wrapped__
        return value


def nest_structure(value: Any) -> Any:
    """The nesting of a batch as JSON: {"tuple": [...]}, {"list": [...]}, {"dict": {...}}, a leaf's index, null."""
    counter = iter(range(1 << 30))
    return _structure(value, counter)


def _structure(value: Any, counter: Iterator[int]) -> Any:
    if isinstance(value, dict):
        return {"dict": {str(k): _structure(value[k], counter) for k in sorted(value)}}
    if isinstance(value, (tuple, list)):
        return {type(value).__name__: [_structure(v, counter) for v in value]}
    return None if value is None else next(counter)
