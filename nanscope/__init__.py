"""nanscope: find out why a TensorFlow/Keras training run produces NaN or Inf, and which fix makes it stop."""

__version__ = "0.1.0"
__all__ = ["__version__"]
