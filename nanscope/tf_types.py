"""The names nanscope gives TensorFlow's and Keras' objects in its annotations.

TensorFlow and Keras ship no types, so each is `Any` to mypy; the name says what a value is.
Import them from here rather than declaring them again in each module.
"""

from collections.abc import Callable
from typing import Any, TypeAlias

Tensor: TypeAlias = Any  # a tf.Tensor (eager or symbolic) or a KerasTensor
Variable: TypeAlias = Any  # a keras.Variable or a tf.Variable
Layer: TypeAlias = Any  # a keras.layers.Layer
KerasModel: TypeAlias = Any  # a keras.Model
Optimizer: TypeAlias = Any  # a keras.optimizers.Optimizer (a LossScaleOptimizer included)
Strategy: TypeAlias = Any  # a tf.distribute.Strategy
ReplicaContext: TypeAlias = Any  # a tf.distribute.ReplicaContext
Batch: TypeAlias = Any  # one step's data as the step takes it: a tensor, a tuple or a dict of them
# What changes a step's gradients between the backward pass and the update (a clipping strategy).
GradTransform: TypeAlias = Callable[[list[Tensor]], list[Tensor]]
