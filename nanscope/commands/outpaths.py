"""Output paths a command was given (--json, --trace, --plot, --save-repro, --tensorboard), checked up front.

A run can train for minutes before it writes its report; a path that cannot be
written should stop it before the first step, with one line naming the option, not
after the work is done.
"""

import os
from collections.abc import Iterable
from pathlib import Path

from nanscope.errors import NanscopeError

# (option, path or None): the option's name as the user typed it, the path it was given.
OptionPath = tuple[str, str | os.PathLike[str] | None]


# The image formats a plot may be written as; matplotlib picks the format from the suffix.
IMAGE_SUFFIXES = (".png", ".svg", ".pdf")


def check_output_paths(files: Iterable[OptionPath] = (), folders: Iterable[OptionPath] = (),
                       images: Iterable[OptionPath] = ()) -> None:
    """Raise NanscopeError for the first path that cannot be written.

    Args:
        files: iterable of (option, path or None). Paths of files to write; "-" (stdout) is fine.
        folders: iterable of (option, path or None). Folders to create or write into.
        images: iterable of (option, path or None). Plots to write: files whose suffix is one of IMAGE_SUFFIXES.
    """
    for option, path in images:
        if path is not None and Path(path).suffix.lower() not in IMAGE_SUFFIXES:
            suffix = Path(path).suffix or "no suffix"
            raise NanscopeError(f"{option}: {path}: expected an image file ending in "
                                f"{', '.join(IMAGE_SUFFIXES[:-1])} or {IMAGE_SUFFIXES[-1]}. Received: {suffix}")
    for option, path in [*files, *images]:
        if path is not None and str(path) != "-":
            _writable(option, Path(path), folder=False)
    for option, path in folders:
        if path is not None:
            _writable(option, Path(path), folder=True)


def _writable(option: str, path: Path, folder: bool) -> None:
    if path.exists() and path.is_dir() != folder:
        kind = "a directory; expected a file path" if not folder else "a file; expected a folder"
        raise NanscopeError(f"{option}: {path} is {kind}")
    ancestor = path if folder and path.exists() else path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NanscopeError(f"{option}: cannot create {path}: {ancestor} is a file, not a folder")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise NanscopeError(f"{option}: cannot write {path}: no write permission in {ancestor}")
