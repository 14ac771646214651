"""Streaming readers: every data source of a run spec as an iterator of row chunks.

A reader opens a source and returns a `DataStream`: the names of its input and
target arrays, the number of rows when it is known without reading the data,
and `chunks(rows)`, which yields `{array name: np.ndarray}` dicts of at most
`rows` rows each. Nothing is held beyond one chunk: npy files are memory-mapped,
npz members, csv and TFRecord files are read piece by piece. TensorFlow is
imported only for TFRecord files and tf.data datasets. A multi-output model's
targets are one target array per output (`checkdata/outputs.py`).
"""

import os
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.checkdata import file_readers
from nanscope.checkdata.outputs import array_names, structure_parts
from nanscope.checkdata.stream import Chunk, DataStream, Output, check_rows, outputs_of
from nanscope.data import synthetic
from nanscope.data.targets import one_per_member
from nanscope.errors import DataError, first_line
from nanscope.model.factory import call_factory, load_callable, received
from nanscope.spec.sections import DataSpec

# open(data, path, base_dir, origin, require_targets): a DataStream over one kind of file.
Reader = Callable[[DataSpec, Path, "str | os.PathLike[str]", str, bool], DataStream]


def _open_tfrecord(data: DataSpec, path: Path, base_dir: str | os.PathLike[str], origin: str,
                   require_targets: bool) -> DataStream:
    del base_dir, require_targets  # Unused
    from nanscope.checkdata.tfrecord_reader import open_tfrecord  # imports TensorFlow

    return open_tfrecord(data, path, origin)


FILE_READERS: dict[str, Reader] = {
    ".npz": file_readers.open_npz,
    ".npy": file_readers.open_npy,
    ".csv": file_readers.open_csv,
    ".tfrecord": _open_tfrecord,
    ".tfrecords": _open_tfrecord,
}


def open_stream(data: DataSpec, base_dir: str | os.PathLike[str], origin: str,
                require_targets: bool = True) -> DataStream:
    """Open the source a `DataSpec` names for streaming.

    Args:
        data: DataSpec. The data section.
        base_dir: Path. Folder that relative paths resolve against.
        origin: str. The file to name in error messages.
        require_targets: bool, default True. False lets an npy file be scanned without a targets file.

    Raises:
        DataError: naming `origin` and the field when the source cannot be read.
    """
    if data.synthetic is not None:
        x, y = synthetic.generate(data.synthetic)
        s = data.synthetic
        return arrays_stream({"x": x}, {"y": y}, f"synthetic {s.kind}, {s.samples} rows", origin, "data.synthetic")
    if data.factory is not None:
        return _factory_stream(data, data.factory, base_dir, origin)
    assert data.path is not None  # DataSpec holds exactly one of synthetic, factory and path
    path = _resolve(data.path, base_dir)
    if not path.is_file():
        raise DataError(f"{origin}: data.path: file not found: {path}")
    reader = FILE_READERS.get(path.suffix.lower())
    if reader is None:
        raise DataError(
            f"{origin}: data.path: unsupported file type {path.suffix or '(none)'!r} for {path}; "
            "expected .npz, .npy, .csv or .tfrecord"
        )
    return reader(data, path, base_dir, origin, require_targets)


def arrays_stream(inputs: Mapping[str, Any], targets: Mapping[str, Any], description: str, origin: str,
                  field_name: str, outputs: Mapping[str, Output] | None = None) -> DataStream:
    """A DataStream over in-memory arrays, after checking that their row counts agree.

    Args:
        inputs, targets: dict. {array name: array}.
        outputs: dict, optional. {target array name: output} for a multi-output model.
    """
    arrays = {**inputs, **targets}
    rows = check_rows({name: np.shape(a) for name, a in arrays.items()}, origin, field_name)

    def chunks(size: int) -> Iterator[Chunk]:
        for start in range(0, rows, size):
            yield {name: array[start : start + size] for name, array in arrays.items()}

    row_bytes = sum(np.asarray(a[:1]).nbytes for a in arrays.values())
    return DataStream(
        description, list(inputs), list(targets), rows, chunks, origin=origin, field=field_name, row_bytes=row_bytes,
        outputs=dict(outputs or {}),
    )


def _resolve(path: str | os.PathLike[str], base_dir: str | os.PathLike[str]) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else Path(base_dir) / p


def _factory_stream(data: DataSpec, factory: str, base_dir: str | os.PathLike[str], origin: str) -> DataStream:
    field_name = "data.factory"
    function = load_callable(factory, base_dir, f"{origin}: {field_name}", DataError)
    result = call_factory(function, data.args, f"{origin}: {field_name}", DataError)
    if type(result).__module__.startswith("tensorflow") and hasattr(result, "element_spec"):
        from nanscope.checkdata.tfrecord_reader import dataset_stream

        return dataset_stream(result, f"{factory} (tf.data)", origin, field_name)
    if isinstance(result, (tuple, list)) and len(result) == 2:
        x, y = result
        try:
            inputs = {k: np.asarray(v) for k, v in x.items()} if isinstance(x, dict) else {"x": np.asarray(x)}
            rows = len(next(iter(inputs.values()))) if inputs and np.ndim(next(iter(inputs.values()))) else 0
            keys = list(y) if isinstance(y, dict) else len(y) if one_per_member(y, rows) else None
            named = array_names(structure_parts(keys, field_name), inputs,
                                lambda part: "y" if part.output is None else f"y{part.output}")
            targets = {name: np.asarray(y if part.source is None else y[part.source]) for name, part in named.items()}
        except (ValueError, TypeError) as exc:  # ragged rows, or something that is not an array at all
            raise DataError(f"{origin}: {field_name}: {factory} returned x or y that is not an array with rows "
                            f"on the first axis: {first_line(exc)}") from exc
        return arrays_stream(inputs, targets, factory, origin, field_name, outputs_of(named))
    raise DataError(
        f"{origin}: {field_name}: {factory} must return (x, y) arrays or a tf.data.Dataset "
        f"of (x, y). Received: {received(result)}"
    )
