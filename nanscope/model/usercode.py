"""Where in the user's own code an exception was raised: the `file:line` an error message points at.

An error from a model factory, a data loader, a loss or a model's `call` names the
spec field it came from; the line in the user's file that raised it is what the
user has to open. Frames in nanscope, the standard library and installed packages
(Keras, TensorFlow) are skipped.
"""

import sysconfig
import traceback
from pathlib import Path

_NANSCOPE = Path(__file__).resolve().parent
_LIBRARIES = {Path(p).resolve() for key in ("stdlib", "platstdlib", "purelib", "platlib")
              if (p := sysconfig.get_paths().get(key))}


def raised_at(exc: BaseException | None) -> str | None:
    """"path/to/model.py:12" for the innermost frame of `exc` (or what it was raised from) in user code, or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        for frame in reversed(traceback.extract_tb(exc.__traceback__)):
            if is_user_file(frame.filename):
                return f"{_shown(frame.filename)}:{frame.lineno}"
        exc = exc.__cause__ or exc.__context__
    return None


def where_suffix(exc: BaseException) -> str:
    """" (at model.py:12)" for a message, or "" when no frame of user code is in the traceback."""
    line = raised_at(exc)
    return f" (at {line})" if line else ""


def is_user_file(filename: str) -> bool:
    """True for a real file outside nanscope, the standard library and installed packages."""
    if not filename or filename.startswith("<"):
        return False
    path = Path(filename).resolve()
    if "site-packages" in path.parts or "dist-packages" in path.parts:
        return False
    return not any(path.is_relative_to(root) for root in (_NANSCOPE, *_LIBRARIES))


def _shown(filename: str) -> str:
    """The path relative to the current folder when it lies below it, else as it is."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return filename
