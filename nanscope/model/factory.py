"""Resolve `file.py:function` and `dotted.module:function` references to callables.

A factory reference runs user code by design: that is how a user's own model,
data loader or loss gets into nanscope.
"""

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

from nanscope.errors import NanscopeError
from nanscope.runtime import quiet_user_imports
from nanscope.model.usercode import where_suffix


def load_callable(reference: str, base_dir: str | os.PathLike[str], field: str,
                  error: type[NanscopeError] = NanscopeError) -> Callable[..., Any]:
    """Import the function a reference names.

    Args:
        reference: str. `path/to/file.py:function` (relative to `base_dir`) or `package.module:function`.
        base_dir: Path. The folder that relative file paths resolve against (the spec's).
        field: str. The spec field the reference came from, for error messages.
        error: type. The NanscopeError subclass to raise.

    Returns:
        The callable.
    """
    path = referenced_file(reference, base_dir, field, error)
    module_ref, _, name = str(reference).rpartition(":")
    module = _import_file(path, field, error) if path is not None else _import_module(module_ref, field, error)
    function = getattr(module, name, None)
    if function is None:
        available = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise error(
            f"{field}: {module_ref} has no function `{name}`"
            + (f"; it defines: {', '.join(available[:8])}" if available else "")
        )
    if not callable(function):
        raise error(f"{field}: `{name}` in {module_ref} is not callable. Received: a {type(function).__name__}")
    return function


def referenced_file(reference: str, base_dir: str | os.PathLike[str], field: str,
                    error: type[NanscopeError] = NanscopeError) -> Path | None:
    """The Python file a `file.py:function` reference names, checked to exist; None for `module:function`.

    Cheap and free of imports, so a spec's references can be checked before TensorFlow loads.

    Raises:
        error: the reference has no `:function`, or its file does not exist.
    """
    module_ref, sep, name = str(reference).rpartition(":")
    if not sep or not module_ref or not name:
        raise error(f"{field}: expected `file.py:function` or `module:function`. Received: {reference!r}")
    if not _is_path(module_ref):
        return None
    path = Path(module_ref).expanduser()
    path = path if path.is_absolute() else Path(base_dir) / path
    if not path.is_file():
        raise error(f"{field}: file not found: {path}")
    return path


def _is_path(module_ref: str) -> bool:
    return module_ref.endswith(".py") or "/" in module_ref or "\\" in module_ref


def load_module_file(path: str | os.PathLike[str], field: str,
                     error: type[NanscopeError] = NanscopeError) -> ModuleType:
    """Import the Python file `path` as a module of its own (not `__main__`); a failure is `error` naming `field`."""
    return _import_file(Path(path), field, error)


def _import_file(path: Path, field: str, error: type[NanscopeError]) -> ModuleType:
    module_name = f"nanscope_user_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:  # a file Python has no loader for (no .py suffix)
        raise error(f"{field}: cannot import {path}: not a Python file (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        with quiet_user_imports():
            spec.loader.exec_module(module)
    except Exception as exc:  # user code: any failure is the user's input problem
        raise error(f"{field}: importing {path} failed: {type(exc).__name__}: {exc}{where_suffix(exc)}") from exc
    finally:
        sys.path.remove(str(path.parent))
    return module


def _import_module(module_ref: str, field: str, error: type[NanscopeError]) -> ModuleType:
    try:
        with quiet_user_imports():
            return importlib.import_module(module_ref)
    except ModuleNotFoundError as exc:
        raise error(f"{field}: no module named {module_ref!r} ({exc})") from exc
    except Exception as exc:
        raise error(f"{field}: importing {module_ref} failed: {type(exc).__name__}: {exc}{where_suffix(exc)}") from exc


def call_factory(function: Callable[..., Any], kwargs: Mapping[str, Any], field: str,
                 error: type[NanscopeError] = NanscopeError) -> Any:
    """Call a user factory, turning any exception it raises into a one-line `error`."""
    try:
        return function(**kwargs)
    except Exception as exc:
        call = f"{function.__name__}({_format_kwargs(kwargs)})"
        raise error(f"{field}: {call} raised {type(exc).__name__}: {exc}{where_suffix(exc)}") from exc


def received(result: object) -> str:
    """What a data factory returned, for an error message: "a int", "a tuple of 3 items (...)"."""
    if isinstance(result, (tuple, list)):
        note = " (x, y, sample_weight): sample weights are not supported" if len(result) == 3 else ""
        return f"a {type(result).__name__} of {len(result)} items{note}"
    return f"a {type(result).__name__}"


def _format_kwargs(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
