"""JSON that never lies about NaN: non-finite floats become "nan", "inf", "-inf".

Also atomic writes: output files are written to a temporary file beside the target
and renamed over it, so an existing report is never left half-written.
"""

import dataclasses
import json
import math
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


# A dataclass field's metadata: the field is left out of its JSON while it is None (a field newer than the
# documents already written, which keep their shape: tests/golden/trace-0.1.0).
OMITTED_WHEN_NONE = {"omitted_when_none": True}


def jsonable(value: Any) -> Any:
    """`value` as plain JSON types, with non-finite floats as strings.

    Runs once per trace line, so the common exact types are tested first.
    """
    kind = type(value)
    if kind is float:
        return encode_float(value)
    if kind is int or kind is str or kind is bool or value is None:
        return value
    if kind is list:
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(item) for f in dataclasses.fields(value)
                if (item := getattr(value, f.name)) is not None or not f.metadata.get("omitted_when_none")}
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return encode_float(float(value))
    if isinstance(value, Path):
        return str(value)
    return value


def encode_float(value: float) -> float | str:
    """A float, or "nan" / "inf" / "-inf" for the non-finite ones (`decode_float` reads them back)."""
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


NONFINITE_SPELLINGS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode_float(value: Any) -> Any:
    """`encode_float`'s inverse: "nan" / "inf" / "-inf" become floats again; any other value is returned as it is."""
    return NONFINITE_SPELLINGS[value] if isinstance(value, str) and value in NONFINITE_SPELLINGS else value


def dumps(value: Any, indent: int | None = 2) -> str:
    return json.dumps(jsonable(value), indent=indent, allow_nan=False)


def write_json(target: str | os.PathLike[str], value: Any) -> None:
    """Write `value` as JSON to a path (atomically) or to stdout when target is "-"."""
    text = dumps(value) + "\n"
    if str(target) == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    write_text_atomic(target, text)


def new_file_mode() -> int:
    """The mode `open(path, "w")` gives a new file: 0666 less the process umask."""
    umask = os.umask(0o022)  # reading the umask means setting it; put it straight back
    os.umask(umask)
    return 0o666 & ~umask


def write_text_atomic(target: str | os.PathLike[str], text: str) -> None:
    """Write text to `target` through a temporary file and a rename."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.chmod(tmp, new_file_mode())  # mkstemp makes it 0600; the report is an ordinary file like the trace
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
