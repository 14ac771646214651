"""The files a run spec names, checked to exist before anything slow starts.

TensorFlow takes seconds to import. A missing model, data or loss file is the
commonest mistake in a new spec, and its error should come at once, not after
that import. The messages are the ones the loaders themselves would give.

Example:
    check_spec_paths(load_spec("run.yaml"))
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from nanscope.data import targets
from nanscope.errors import DataError, ModelError, SpecError
from nanscope.model.factory import referenced_file

if TYPE_CHECKING:
    from nanscope.spec.sections import LossSpec, RunSpec

NPY_SUFFIX = ".npy"


def check_spec_paths(spec: RunSpec, sections: Iterable[str] = ("model", "data", "train")) -> None:
    """Raise the loader's error for the first file the spec names that does not exist.

    Args:
        spec: RunSpec. A validated spec (paths resolve against its folder).
        sections: iterable of str, default all. The sections whose files the command will read
            (check-data reads only `data`).

    Raises:
        ModelError, DataError, SpecError: naming the spec file, the field and the path.
    """
    checks = {"model": _model_paths, "data": _data_paths, "train": _loss_paths}
    for section in sections:
        checks[section](spec)


def _model_paths(spec: RunSpec) -> None:
    model, where = spec.model, f"{spec.source}: model"
    if model.factory is not None:
        referenced_file(model.factory, spec.base_dir, f"{where}.factory", ModelError)
    elif model.path is not None and not spec.resolve(model.path).exists():  # ModelSpec holds a factory or a path
        raise ModelError(f"{where}.path: file not found: {spec.resolve(model.path)}")


def _data_paths(spec: RunSpec) -> None:
    data, where = spec.data, f"{spec.source}: data"
    if data.factory is not None:
        referenced_file(data.factory, spec.base_dir, f"{where}.factory", DataError)
    if data.path is None:
        return
    path = spec.resolve(data.path)
    if not path.exists():
        raise DataError(f"{where}.path: file not found: {path}")
    if path.suffix.lower() == NPY_SUFFIX:
        for y_path in targets.parts(targets.convert(data.y, spec.resolve)):
            if not y_path.is_file():
                raise DataError(f"{where}.y: for an .npy input, `y` names the targets' .npy file; not found: {y_path}")


def _loss_paths(spec: RunSpec) -> None:
    loss, where = spec.train.loss, f"{spec.source}: train.loss"
    named: list[tuple[str, LossSpec]] = (
        [(f"{where}.{name}", one) for name, one in loss.items()] if isinstance(loss, dict) else
        [(f"{where}[{i}]", one) for i, one in enumerate(loss)] if isinstance(loss, list) else
        [(where, loss)] if loss is not None else [])
    for field, one in named:
        if ":" in one.name:
            referenced_file(one.name, spec.base_dir, field, SpecError)
