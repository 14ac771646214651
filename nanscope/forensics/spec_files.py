"""The files a trace-steps repro needs, copied into it: the spec's code, its model file, its data files.

`trace-steps --save-repro DIR` writes a bundle that replays from its folder alone: the
Python files the spec references (`file.py:function` in `model.factory`,
`data.factory`, `train.loss`, with the files they import from their own folder), a
saved model (`model.path`) and the data files (`data.path`, and the targets' `.npy`
files) are copied in, and the spec in repro.json names them relative to the bundle.
Data files larger than `DATA_COPY_LIMIT` together are not copied: the spec keeps their
path, repro.json says so (`not_copied`), and the replay needs them there. A
`module:function` reference, or a path inside a factory's `args`, is left as it is.
"""

import copy
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nanscope.data import targets
from nanscope.model.factory import referenced_file
from nanscope.forensics.bundle_code import copy_code, origin_name

if TYPE_CHECKING:
    from nanscope.spec.sections import RunSpec

# (get, put) of one `file.py:function` in a spec document.
Reference = tuple[Callable[[], str], Callable[[str], None]]

DATA_COPY_LIMIT = 256 * 2 ** 20  # bytes; a bundle is for sharing, a dataset of gigabytes is not
NPY_SUFFIX = ".npy"


def bundle_spec(spec: "RunSpec", folder: Path) -> tuple[dict[str, Any], list[dict[str, str]], list[str]]:
    """Copy what `spec` references into `folder`; (spec document relative to the bundle, code_files, not_copied).

    Args:
        spec: RunSpec, validated (its paths resolve against its own folder).
        folder: Path. The bundle folder being written.
    """
    document = copy.deepcopy(spec.model_dump(mode="json"))
    references = list(_code_references(document))
    files = [referenced_file(get(), spec.base_dir, "") for get, _ in references]
    copies = copy_code([f for f in files if f is not None], folder)
    for (get, put), path in zip(references, files):
        if path is not None:
            put(f"{copies[path.resolve()]}:{get().rpartition(':')[2]}")
    model = document["model"]
    if model.get("path"):
        model["path"] = _copy_into(spec.resolve(model["path"]), folder / "model")
    not_copied = _bundle_data(spec, document["data"], folder)
    code_files = [{"file": relative, "origin": origin_name(path)} for path, relative in copies.items()]
    return document, code_files, not_copied


def _code_references(document: dict[str, Any]) -> Iterator[Reference]:
    """(get, put) for each `file.py:function` the spec document holds."""
    def field(section: dict[str, Any], key: str) -> Reference:
        return (lambda: section[key]), (lambda value: section.__setitem__(key, value))

    for section in (document["model"], document["data"]):
        if section.get("factory"):
            yield field(section, "factory")
    loss = document["train"].get("loss")
    named = [loss] if isinstance(loss, dict) and "name" in loss else (
        list(loss.values()) if isinstance(loss, dict) else list(loss or []))
    for one in named:
        if isinstance(one, dict) and ":" in str(one.get("name", "")):
            yield field(one, "name")


def _bundle_data(spec: "RunSpec", data: dict[str, Any], folder: Path) -> list[str]:
    if not data.get("path"):
        return []
    path = spec.resolve(data["path"])
    y_files: list[Path] = []
    if path.suffix.lower() == NPY_SUFFIX:
        y_files = [spec.resolve(p) for p in targets.parts(targets.convert(data["y"], str))]
    total = sum(_size(p) for p in [path, *y_files])
    if total > DATA_COPY_LIMIT:
        data["path"] = str(path)
        if y_files:
            data["y"] = targets.convert(data["y"], lambda p: str(spec.resolve(p)))
        return [str(p) for p in [path, *y_files]]
    data["path"] = _copy_into(path, folder / "data")
    if y_files:
        data["y"] = _listed(targets.convert(data["y"], lambda p: _copy_into(spec.resolve(p), folder / "data")))
    return []


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _copy_into(path: Path, target: Path) -> str:
    """Copy the file or folder `path` into `target` (created); its path relative to the bundle folder."""
    target.mkdir(parents=True, exist_ok=True)
    destination = target / path.name
    if path.is_dir():
        shutil.copytree(path, destination, dirs_exist_ok=True)
    else:
        shutil.copy2(path, destination)
    return f"{target.name}/{path.name}"


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    return path.stat().st_size if path.exists() else 0
