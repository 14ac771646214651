"""Load the training data a spec names into numpy arrays.

Every source (synthetic, npz, npy, csv, TFRecord, a Python factory) ends as a
`LoadedData`: `x` and `y` arrays with the same number of rows, plus the names of
the input features and target columns for reports. A diagnosis run draws a few
hundred batches, so the data is held in memory; `check-data` streams instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from nanscope.data import files, inputs, synthetic, targets
from nanscope.data.datasets import materialize
from nanscope.data.targets import Arrays
from nanscope.errors import DataError, first_line
from nanscope.model.factory import call_factory, load_callable, received


if TYPE_CHECKING:
    from nanscope.spec.sections import RunSpec

# Rows per block when a file is read whole (the csv and TFRecord readers parse a block at a time).
READ_ROWS = 65536

@dataclass
class LoadedData:
    """Training arrays and where they came from.

    Args:
        x: np.ndarray. Inputs, first axis rows. For a model with several inputs, one array per
            input: a mapping from input name, or a tuple in the model's input order (`data/inputs.py`).
        y: np.ndarray. Targets, first axis rows. For a multi-output model, one array per
            output: a mapping from output name (or a list) as loaded, a tuple in the
            model's output order once the session has arranged them (`data/targets.py`).
        description: str. One line for the report header ("synthetic regression, 1000 rows").
        feature_names: list of str. One name per input column (last axis), when known.
        target_names: list of str. One name per target column, when known.
        input_dtypes: dict. Per input label ("x", "x['tokens']"), its dtype as the source gave it; integer
            inputs are fed to the model as float32, and this is how the rules still know they hold ids.
    """

    x: Arrays
    y: Arrays
    description: str
    feature_names: list[str] = field(default_factory=list)
    target_names: list[str] = field(default_factory=list)
    input_dtypes: dict[str, str] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return inputs.rows(self.x)


def load_data(spec: RunSpec) -> LoadedData:
    """Load the data section of a RunSpec.

    Raises:
        DataError: naming the file and field when the data cannot be read or is inconsistent.
    """
    data = spec.data
    if data.synthetic is not None:
        x, y = synthetic.generate(data.synthetic)
        s = data.synthetic
        loaded = LoadedData(x, y, f"synthetic {s.kind}, {s.samples} rows x {s.features} features (seed {s.seed})")
    elif data.factory is not None:
        loaded = _from_factory(spec, data.factory)
    else:
        assert data.path is not None  # DataSpec holds exactly one of synthetic, factory and path
        loaded = _from_file(spec, spec.resolve(data.path))
    return _checked(loaded, spec)


def _from_file(spec: RunSpec, path: Path) -> LoadedData:
    if not path.exists():
        raise DataError(f"{spec.source}: data.path: file not found: {path}")
    suffix = path.suffix.lower()
    readers = {".npz": _read_npz, ".npy": _read_npy, ".csv": _read_csv, ".tfrecord": _read_tfrecord,
               ".tfrecords": _read_tfrecord}
    if suffix not in readers:
        raise DataError(
            f"{spec.source}: data.path: unsupported file type {suffix or '(none)'!r} for {path}; "
            "expected .npz, .npy, .csv or .tfrecord"
        )
    return readers[suffix](spec, path)


def _read_npz(spec: RunSpec, path: Path) -> LoadedData:
    with files.NpzFile(path, spec.source) as archive:
        keys = [spec.data.x, *targets.parts(spec.data.y)]
        for field_name, key in (("data.x", spec.data.x), *(("data.y", k) for k in targets.parts(spec.data.y))):
            archive.check(field_name, key)
        arrays = {key: archive.read(key) for key in keys}
    x, y = arrays[spec.data.x], targets.convert(spec.data.y, lambda key: arrays[key])
    return LoadedData(x, y, f"{path.name}, {len(x)} rows")


def _read_npy(spec: RunSpec, path: Path) -> LoadedData:
    y_paths = targets.convert(spec.data.y, spec.resolve)
    for y_path in targets.parts(y_paths):
        if not y_path.is_file():
            raise DataError(
                f"{spec.source}: data.y: for an .npy input, `y` names the targets' .npy file; not found: {y_path}")
    x = np.array(files.load_npy(path, spec.source, "data.path"))
    y = targets.convert(y_paths, lambda p: np.array(files.load_npy(p, spec.source, "data.y")))
    names = " + ".join(p.name for p in targets.parts(y_paths))
    return LoadedData(x, y, f"{path.name} + {names}, {len(x)} rows")


def _read_csv(spec: RunSpec, path: Path) -> LoadedData:
    per_output = _target_columns(spec.data.target)
    columns = [c for group in per_output.values() for c in group]
    if not columns:
        raise DataError(f"{spec.source}: data.target: a csv source needs `target:` naming the target column(s)")
    header = files.csv_header(path, spec.source)
    missing = [t for t in columns if t not in header]
    if missing:
        raise DataError(f"{spec.source}: data.target: column(s) {missing} not in {path.name}; columns are {header}")
    blocks = list(files.csv_blocks(path, header, spec.source, READ_ROWS))
    table = np.concatenate(blocks).astype(np.float32) if blocks else np.zeros((0, len(header)), np.float32)
    feature_idx = [i for i in range(len(header)) if header[i] not in columns]
    y: dict[Any, np.ndarray] = {name: table[:, [header.index(c) for c in group]] for name, group in per_output.items()}
    return LoadedData(
        table[:, feature_idx], y.get(None, y), f"{path.name}, {len(table)} rows",
        feature_names=[header[i] for i in feature_idx], target_names=columns,
    )


def _target_columns(target: Any) -> dict[str | None, list[str]]:
    """{output name: [columns]} from `data.target`; the key None when there is one output."""
    if isinstance(target, dict):
        return {name: files.csv_columns(cols) for name, cols in target.items()}
    return {None: files.csv_columns(target or [])}


def _read_tfrecord(spec: RunSpec, path: Path) -> LoadedData:
    features = spec.data.features
    target: Any = spec.data.target  # checked below: each label a str that names a feature
    labels = list(target.values()) if isinstance(target, dict) else [target]
    if not features or not all(isinstance(t, str) and t in features for t in labels):
        raise DataError(
            f"{spec.source}: data.features: a TFRecord source needs `features:` (name -> {{dtype, shape}}) "
            "and `target:` naming one of them (per output of a multi-output model, a mapping from output name)"
        )
    parsed = files.whole(files.tfrecord_blocks(path, {name: (f.dtype, f.shape) for name, f in features.items()},
                                               spec.source, READ_ROWS))
    arrays = {name: parsed.get(name, np.zeros((0, *f.shape))) for name, f in features.items()}
    input_names = [name for name in features if name not in labels]
    if not input_names:
        raise DataError(f"{spec.source}: data.features: only the target(s) {labels} are listed; "
                        "expected input features too")
    x = (np.concatenate([arrays[n].reshape(len(arrays[n]), -1) for n in input_names], axis=1)
         if len(input_names) > 1 else arrays[input_names[0]])
    y = {name: arrays[feature] for name, feature in target.items()} if isinstance(target, dict) else arrays[target]
    return LoadedData(x.astype(np.float32), y, f"{path.name}, {len(x)} rows", feature_names=input_names,
                      target_names=labels)


def _from_factory(spec: RunSpec, factory: str) -> LoadedData:
    field_name = "data.factory"
    function = load_callable(factory, spec.base_dir, f"{spec.source}: {field_name}", DataError)
    result = call_factory(function, spec.data.args, f"{spec.source}: {field_name}", DataError)
    if _is_tf_dataset(result):
        where = f"{spec.source}: {field_name}"
        x, y, endless = materialize(result, spec.train.steps, spec.data.batch_size, spec.data.validation.fraction,
                                    where)
        rows = inputs.rows(x)
        if endless:
            return LoadedData(x, y, f"{spec.data.factory}, an endless dataset: its first {rows} rows "
                                    f"({spec.train.steps} steps x batch {spec.data.batch_size})")
    elif isinstance(result, (tuple, list)) and len(result) == 2:
        try:
            raw_x, raw_y = result
            first_y: Any = targets.parts(raw_y)[0] if isinstance(raw_y, (dict, tuple, list)) and len(raw_y) else raw_y
            y_rows = len(first_y) if np.ndim(first_y) >= 1 else None
            x = inputs.convert(raw_x, np.asarray) if inputs.several(raw_x, y_rows) else np.asarray(raw_x)
            rows = inputs.rows(x) if np.ndim(inputs.parts(x)[0]) else 0
            y = targets.convert(raw_y, np.asarray) if targets.one_per_member(raw_y, rows) else np.asarray(raw_y)
        except (ValueError, TypeError) as exc:  # ragged rows, or something that is not an array at all
            raise DataError(f"{spec.source}: {field_name}: {spec.data.factory} returned x or y that is not an array "
                            f"with rows on the first axis: {first_line(exc)}") from exc
    else:
        raise DataError(
            f"{spec.source}: {field_name}: {spec.data.factory} must return (x, y) arrays or a tf.data.Dataset "
            f"of (x, y). Received: {received(result)}"
        )
    return LoadedData(x, y, f"{spec.data.factory}, {rows} rows")


def _is_tf_dataset(value: object) -> bool:
    return type(value).__module__.startswith("tensorflow") and hasattr(value, "element_spec")


def _checked(loaded: LoadedData, spec: RunSpec) -> LoadedData:
    field_name = "data.path" if spec.data.path else "data.factory" if spec.data.factory else "data.synthetic"
    where = f"{spec.source}: {field_name}"
    if any(np.ndim(part) == 0 for part in [*inputs.parts(loaded.x), *targets.parts(loaded.y)]):
        raise DataError(f"{where}: x and y must be arrays with rows on the first axis")
    rows = inputs.rows(loaded.x)
    if rows == 0:
        raise DataError(f"{where}: the dataset is empty (0 rows)")
    first = inputs.named(loaded.x)[0][0]
    for name, part in [*inputs.named(loaded.x)[1:], *targets.named(loaded.y)]:
        if len(part) != rows:
            raise DataError(f"{where}: {first} has {rows} rows but {name} has {len(part)}")
    fraction = spec.data.validation.fraction
    if round(rows * fraction) >= rows:
        raise DataError(
            f"{spec.source}: data.validation.fraction: {fraction} of {rows} rows leaves no training rows; "
            "expected a fraction that keeps at least one"
        )
    for name, part in inputs.named(loaded.x):
        if not (np.issubdtype(part.dtype, np.number) or part.dtype == bool):
            raise DataError(f"{where}: {name} must be numeric. Received dtype {part.dtype}")
    loaded.input_dtypes = {name: str(part.dtype) for name, part in inputs.named(loaded.x)}
    loaded.x = inputs.convert(loaded.x, _float_inputs)
    loaded.y = targets.convert(loaded.y, targets.as_float32)
    if not loaded.feature_names and isinstance(loaded.x, np.ndarray) and loaded.x.ndim == 2:  # one input array
        loaded.feature_names = [f"x[{i}]" for i in range(loaded.x.shape[1])]
    if not loaded.target_names and isinstance(loaded.y, np.ndarray):  # one target array
        loaded.target_names = [f"y[{i}]" for i in range(loaded.y.shape[1])] if loaded.y.ndim == 2 else ["y"]
    return loaded


def _float_inputs(x: np.ndarray) -> np.ndarray:
    """float64, bool and integer inputs as float32, which is what the model computes in; other floats as given."""
    if x.dtype == np.float64 or x.dtype == bool or np.issubdtype(x.dtype, np.integer):
        return x.astype(np.float32)
    return x


def split_validation(loaded: LoadedData, fraction: float) -> tuple[LoadedData, LoadedData | None]:
    """(train, validation) LoadedData: the last `fraction` of rows held out, as Keras' validation_split."""
    n_val = round(loaded.rows * fraction)
    if n_val == 0:
        return loaded, None
    if n_val >= loaded.rows:
        raise DataError(f"data.validation.fraction={fraction} leaves no training rows out of {loaded.rows}")
    cut = loaded.rows - n_val

    def part(sl: slice) -> LoadedData:
        return LoadedData(inputs.take(loaded.x, sl), targets.take(loaded.y, sl), loaded.description,
                          loaded.feature_names, loaded.target_names, loaded.input_dtypes)

    return part(slice(0, cut)), part(slice(cut, None))
