"""nanscope: find out why a TensorFlow/Keras training run produces NaN or Inf, and which fix makes it stop."""

from typing import Any

from nanscope.runtime import VERSION as __version__

__all__ = ["NonFiniteError", "__version__", "instrument"]


def __getattr__(name: str) -> Any:
    # Imported on first use: `nanscope --help` must not import TensorFlow.
    if name == "instrument":
        from nanscope.keras.instrument import instrument

        return instrument
    if name == "NonFiniteError":
        from nanscope.errors import NonFiniteError

        return NonFiniteError
    raise AttributeError(f"module 'nanscope' has no attribute {name!r}")
