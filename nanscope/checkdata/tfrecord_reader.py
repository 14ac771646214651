"""Streaming readers that need TensorFlow: TFRecord files and tf.data datasets.

TFRecord files are read a batch of records at a time (`data.files.tfrecord_blocks`,
which training uses too) and parsed with the feature spec of the run spec's
`data.features`; when no spec is given (a file passed directly) the features are
read off the first record. A dataset from a factory is
iterated batch by batch; an unbatched one is batched here. Per output of a
multi-output model, `data.target` maps output names to label features, and a
dataset yields `(x, {output: y})` or `(x, (y0, y1, ...))`.
"""

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from nanscope.checkdata.outputs import array_names, spec_parts, structure_parts
from nanscope.checkdata.outputs import TargetPart
from nanscope.checkdata.stream import Chunk, DataStream, outputs_of
from nanscope.data.files import tfrecord_blocks
from nanscope.errors import DataError
from nanscope.runtime import tensorflow
from nanscope.spec.sections import DataSpec

# A tf.data.Dataset and TensorFlow's module: TF ships no types (Any to mypy).
Dataset = Any
Features = dict[str, tuple[str, list[int]]]


def open_tfrecord(data: DataSpec, path: Path, origin: str) -> DataStream:
    """A DataStream over a TFRecord file of tf.train.Example records."""
    tf, _ = tensorflow()
    features: Features = {name: (f.dtype, list(f.shape)) for name, f in (data.features or {}).items()}
    if not features:
        features = _features_of_first_record(tf, path, origin)
    parts = spec_parts(data.target, "data.target", list_is_one_target=True)
    parts = [part for part in parts if part.source is not None]
    for part in parts:
        if not isinstance(part.source, str) or part.source not in features:
            raise DataError(f"{origin}: {part.field}: {part.source!r} is not one of the features {sorted(features)}")
    labels = {part.source for part in parts}
    inputs = [name for name in features if name not in labels]
    targets = array_names(parts, inputs, lambda part: part.source)

    def chunks(size: int) -> Iterator[Chunk]:
        for arrays in tfrecord_blocks(path, features, origin, size):
            yield {**{name: arrays[name] for name in inputs},
                   **{name: arrays[part.source] for name, part in targets.items()}}

    return DataStream(path.name, inputs, list(targets), None, chunks, origin=origin, outputs=outputs_of(targets))


def _features_of_first_record(tf: Any, path: Path, origin: str) -> Features:
    try:
        first = next(iter(tf.data.TFRecordDataset(str(path)).take(1)), None)
    except (tf.errors.InvalidArgumentError, tf.errors.DataLossError) as exc:
        raise DataError(f"{origin}: data.path: cannot read {path.name} as TFRecord: {exc.message}") from None
    if first is None:
        raise DataError(f"{origin}: data.path: the dataset is empty (0 records in {path.name})")
    example = tf.train.Example.FromString(first.numpy())
    features: Features = {}
    for name, feature in example.features.feature.items():
        kind = feature.WhichOneof("kind")
        if kind == "bytes_list":
            continue
        values = getattr(feature, kind).value
        shape = [] if len(values) == 1 else [len(values)]
        features[name] = ("float32" if kind == "float_list" else "int64", shape)
    return features


def dataset_stream(dataset: Dataset, description: str, origin: str, field_name: str) -> DataStream:
    """A DataStream over a finite tf.data.Dataset of (x, y) elements (x, y arrays or dicts of arrays)."""
    tf, _ = tensorflow()
    element = dataset.element_spec
    if not (isinstance(element, tuple) and len(element) == 2):
        raise DataError(f"{origin}: {field_name}: the dataset must yield (x, y) pairs. Received elements of {element}")
    if dataset.cardinality() == tf.data.INFINITE_CARDINALITY:
        raise DataError(
            f"{origin}: {field_name}: the dataset is infinite; check-data needs a finite one (drop .repeat())"
        )
    first_x = next(iter(tf.nest.flatten(element[0])))
    batched = bool(first_x.shape.rank) and first_x.shape[0] is None
    inputs = list(element[0]) if isinstance(element[0], dict) else ["x"]
    targets = array_names(_target_parts(element[1], field_name), inputs,
                          lambda part: "y" if part.output is None else f"y{part.output}")

    def chunks(size: int) -> Iterator[Chunk]:
        source = dataset if batched else dataset.batch(size)
        for x, y in source.as_numpy_iterator():
            x = {k: np.asarray(v) for k, v in x.items()} if isinstance(x, dict) else {"x": np.asarray(x)}
            yield {**x, **{name: np.asarray(y if part.source is None else y[part.source])
                           for name, part in targets.items()}}

    return DataStream(description, inputs, list(targets), None, chunks, origin=origin, field=field_name,
                      outputs=outputs_of(targets))


def _target_parts(spec: Any, field_name: str) -> list[TargetPart]:
    """One part per target of a dataset element: per key of a dict, per member of a tuple, or the one tensor."""
    if isinstance(spec, dict):
        return structure_parts(list(spec), field_name)
    if isinstance(spec, (tuple, list)):
        return structure_parts(len(spec), field_name)
    return structure_parts(None, field_name)
