"""Where an op came from: the user's `file:line` behind it, read from the Python stack while the op runs.

User code is any frame outside nanscope, TensorFlow, Keras, numpy and the standard library.
"""

import os
import sys
import sysconfig
from collections.abc import Collection
from types import FrameType

import numpy as np

from nanscope.runtime import tensorflow


def user_source(library_dirs: Collection[str]) -> str | None:
    """`file:line` of the innermost user frame below nanscope's own replay frames, or None.

    Args:
        library_dirs: set of str. Folders whose frames are not user code (see `library_dirs`).
    """
    frames = _stack_frames()
    while frames and _in_dir(frames[-1][0], _NANSCOPE_DIR):
        frames.pop()
    last_own = max((i for i, (f, _) in enumerate(frames) if _in_dir(f, _NANSCOPE_DIR)), default=-1)
    for filename, line in reversed(frames[last_own + 1:]):
        if not any(_in_dir(filename, d) for d in library_dirs) and not filename.startswith("<"):
            return f"{_shown_path(filename)}:{line}"
    return None


_NANSCOPE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _stack_frames() -> list[tuple[str, int]]:
    frames: list[tuple[str, int]] = []
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        frames.append((os.path.abspath(frame.f_code.co_filename), frame.f_lineno))
        frame = frame.f_back
    return frames[::-1]


def keras_loss_source() -> str | None:
    """`file:line` of the innermost frame in Keras' losses package (a Keras loss's own code), or None."""
    _, keras = tensorflow()
    losses_dir = os.path.join(os.path.dirname(os.path.abspath(keras.__file__)), "src", "losses")
    site = os.path.dirname(os.path.dirname(os.path.abspath(keras.__file__)))
    for filename, line in reversed(_stack_frames()):
        if _in_dir(filename, losses_dir):
            return f"{os.path.relpath(filename, site)}:{line}"
    return None


def library_dirs() -> set[str]:
    """The folders of TensorFlow, Keras, numpy, the standard library and site-packages."""
    tf, keras = tensorflow()
    dirs = {os.path.dirname(os.path.abspath(m.__file__)) for m in (tf, keras, np) if m.__file__ is not None}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path:
            dirs.add(os.path.abspath(path))
    return dirs


def _in_dir(filename: str, directory: str) -> bool:
    return filename == directory or filename.startswith(directory + os.sep)


def _shown_path(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative
