"""check-data's streams over numpy and csv files: bounded memory however large the file.

The files are read by the readers training uses too (`nanscope.data.files`); this
module names the arrays of a data section (inputs, one target array per output) and
wraps the readers' blocks in a `DataStream`.
"""

import os
from collections.abc import Iterator
from pathlib import Path

from nanscope.checkdata.outputs import array_names, spec_parts
from nanscope.checkdata.stream import Chunk, DataStream, check_rows, outputs_of
from nanscope.data.files import NpzFile, csv_blocks, csv_columns, csv_header, load_npy
from nanscope.errors import DataError
from nanscope.spec.sections import DataSpec


def open_npz(data: DataSpec, path: Path, base_dir: str | os.PathLike[str], origin: str,
             require_targets: bool = True) -> DataStream:
    """A DataStream over the `data.x` member of an .npz archive and the `data.y` member(s), one per output."""
    del base_dir, require_targets  # Unused
    archive = NpzFile(path, origin)
    parts = spec_parts(data.y, "data.y")
    shapes: dict[str, tuple[int, ...]] = {}
    for field_name, key in (("data.x", data.x), *((part.field, part.source) for part in parts)):
        shapes[key] = archive.check(field_name, key)[0]
    targets = array_names(parts, [data.x], lambda part: part.source)
    sources = {data.x: data.x, **{name: part.source for name, part in targets.items()}}
    rows = check_rows({name: shapes[key] for name, key in sources.items()}, origin, "data.path")
    keys = list(shapes)

    def chunks(size: int) -> Iterator[Chunk]:
        for block in archive.blocks(keys, rows, size):
            yield {name: block[key] for name, key in sources.items()}

    row_bytes = sum(archive.row_bytes(key) for key in keys)
    return DataStream(f"{path.name}, {rows} rows", [data.x], list(targets), rows, chunks, origin=origin,
                      row_bytes=row_bytes, outputs=outputs_of(targets))


def open_npy(data: DataSpec, path: Path, base_dir: str | os.PathLike[str], origin: str,
             require_targets: bool = True) -> DataStream:
    """A DataStream over a memory-mapped .npy file of inputs and, from `data.y`, one of targets per output."""
    x = load_npy(path, origin, "data.path")
    parts = spec_parts(data.y, "data.y")
    targets = array_names(parts, ["x"], lambda part: "y" if part.output is None else Path(part.source).stem)
    arrays, files = {"x": x}, list[str]()
    for name, part in targets.items():
        y_path = Path(part.source).expanduser()
        y_path = y_path if y_path.is_absolute() else Path(base_dir) / y_path
        if y_path.is_file():
            arrays[name] = load_npy(y_path, origin, part.field)
            files.append(y_path.name)
        elif require_targets or part.output is not None:
            raise DataError(
                f"{origin}: {part.field}: for an .npy input, `y` names the targets' .npy file; not found: {y_path}")
    rows = check_rows({name: a.shape for name, a in arrays.items()}, origin, "data.path")

    def chunks(size: int) -> Iterator[Chunk]:
        for start in range(0, rows, size):
            yield {name: a[start : start + size] for name, a in arrays.items()}

    described = " + ".join([path.name, *files]) + f", {rows} rows"
    row_bytes = sum(a[:1].nbytes for a in arrays.values())
    targets = {name: part for name, part in targets.items() if name in arrays}
    return DataStream(described, ["x"], list(targets), rows, chunks, origin=origin, row_bytes=row_bytes,
                      outputs=outputs_of(targets))


def open_csv(data: DataSpec, path: Path, base_dir: str | os.PathLike[str], origin: str,
             require_targets: bool = True) -> DataStream:
    """A DataStream over a csv file with a header; `data.target` names the target column(s), per output or not."""
    del base_dir  # Unused
    header = csv_header(path, origin)
    parts = [part for part in spec_parts(data.target, "data.target", list_is_one_target=True) if part.source]
    if not parts and require_targets:
        raise DataError(f"{origin}: data.target: a csv source needs `target:` naming the target column(s)")
    for part in parts:
        missing = [t for t in csv_columns(part.source) if t not in header]
        if missing:
            raise DataError(f"{origin}: {part.field}: column(s) {missing} not in {path.name}; columns are {header}")
    targets = array_names(parts, ["inputs"], lambda _part: "targets")
    target_idx = {name: [header.index(c) for c in csv_columns(part.source)] for name, part in targets.items()}
    taken = {i for idx in target_idx.values() for i in idx}
    feature_idx = [i for i in range(len(header)) if i not in taken]

    def chunks(size: int) -> Iterator[Chunk]:
        for table in csv_blocks(path, header, origin, size):
            yield {"inputs": table[:, feature_idx], **{name: table[:, idx] for name, idx in target_idx.items()}}

    names = {"inputs": [header[i] for i in feature_idx],
             **{name: csv_columns(part.source) for name, part in targets.items()}}
    return DataStream(path.name, ["inputs"], list(targets), None, chunks, column_names=names, origin=origin,
                      outputs=outputs_of(targets))
