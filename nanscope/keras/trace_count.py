"""The user's step traced as often with nanscope as without it: the seeds its unseeded random ops draw.

TensorFlow traces a tf.function once more when its first trace made a variable
(`_created_variables`), and every trace of the user's step draws again the seed of each
unseeded legacy random op in it (`tf.keras.backend.random_normal` takes one from numpy's
global generator). Without nanscope, a step whose optimizer (or model) is not built yet
builds it in its first trace, so it is traced twice; a step with everything built is
traced once.

nanscope makes its own variables of the step past TensorFlow's count
(`internals.untraced_variable`), so they add no trace. Where nanscope itself built,
before the step's first trace, what that trace would have built (it builds the
optimizer to copy its slots, and an unbuilt model from the first batch), and that
build made a variable (`makes_variables`), the trace would lose its second run:
`FirstTrace` makes one variable in it instead, one TensorFlow counts, and the step is
traced twice, as without nanscope.
"""

from collections.abc import Callable
from typing import Any

from nanscope.runtime import tensorflow


def makes_variables(build: Callable[[], object]) -> bool:
    """Run `build`; True when it made a tf.Variable (a build that made none would have added no trace)."""
    tf, _ = tensorflow()
    made = False

    def counted(next_creator: Callable[..., Any], **kwargs: Any) -> Any:
        nonlocal made
        made = True
        return next_creator(**kwargs)

    with tf.variable_creator_scope(counted):
        build()
    return made


class FirstTrace:
    """One counted variable made in the step's first trace, when nanscope built what that trace would have.

    Args:
        built_ahead: bool. nanscope built, before the first trace, variables the user's step would have
            made in it.
    """

    def __init__(self, built_ahead: bool) -> None:
        self.built_ahead = built_ahead
        self.variable: Any = None

    def made_in_trace(self) -> None:
        """In the traced step: on the first trace after a build ahead, make the variable TensorFlow counts."""
        if not self.built_ahead or self.variable is not None:
            return
        tf, _ = tensorflow()
        with tf.init_scope():
            self.variable = tf.Variable(False, trainable=False, name="nanscope_first_trace")
