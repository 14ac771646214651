"""Per-variable statistics and the pre-step snapshot of the weights.

The healthy path costs one fused pass per statistic and variable: `tf.nn.l2_loss`
(sum of squares in one kernel, no temporary) for gradient, weight and update norms.
The exact non-finite counts, and norms that would overflow a float32 sum of squares,
are computed only when a sum shows there is something to count.
"""

from nanscope.runtime import tensorflow


class Snapshot:
    """One extra copy of the model's weights, taken before each update.

    Only the model's variables are copied (the issue's budget: one extra copy of the
    weights). The optimizer's slots are not, so replaying a step's update starts from
    the optimizer state as it was after that step.

    Args:
        variables: list of the model's variables (trainable first).
    """

    def __init__(self, variables):
        tf, _ = tensorflow()
        self.variables = list(variables)
        self.copies = [tf.Variable(tf.convert_to_tensor(v), trainable=False, name="nanscope_snapshot")
                       for v in self.variables]

    def take(self):
        """Copy the variables' current values (inside the step, before the update)."""
        tf, _ = tensorflow()
        for copy, variable in zip(self.copies, self.variables):
            copy.assign(tf.convert_to_tensor(variable))

    def restore(self):
        """Put the copied values back into the variables."""
        for copy, variable in zip(self.copies, self.variables):
            variable.assign(copy)

    def values(self, count):
        """numpy copies of the first `count` snapshotted variables."""
        return [copy.numpy() for copy in self.copies[:count]]


# Columns of a variable-stats row, in order. |dw|/|w| is taken against the weights after
# the update: one pass fewer than also measuring them before, and the same ratio to
# three digits whenever the ratio is small enough to be healthy.
VARIABLE_COLUMNS = ("grad_norm", "grad_nonfinite", "weight_norm", "update_norm", "weight_nonfinite")
GRAD_NONFINITE, WEIGHT_NONFINITE = 1, 4


def variable_rows(grads, before, after, applied=None):
    """Per-variable statistics: ([n, 5] rows, global grad norm, global applied-grad norm).

    Row columns: see VARIABLE_COLUMNS.

    Args:
        grads: list of gradient tensors, one per variable.
        before: list of the variables' values before the update (snapshot copies or tensors).
        after: list of the variables (or their values) after the update.
        applied: list of the gradients handed to the optimizer, when they differ from `grads`.
    """
    tf, _ = tensorflow()
    if not grads:
        return tf.zeros([0, len(VARIABLE_COLUMNS)]), tf.constant(0.0), tf.constant(0.0)
    pairs = [(_f32(g), _f32(b), _f32(v)) for g, b, v in zip(grads, before, after)]
    squares = tf.stack([tf.stack([tf.nn.l2_loss(g), tf.nn.l2_loss(v), tf.nn.l2_loss(v - b)]) for g, b, v in pairs]) * 2.0

    def plain():
        zeros = tf.zeros([len(pairs)])
        return tf.stack([zeros, zeros], axis=1), tf.sqrt(squares)

    def recount():
        counts = tf.stack([tf.stack([_nonfinite(g), _nonfinite(v)]) for g, _, v in pairs])
        norms = tf.stack([tf.stack([_scaled_norm(t) for t in (g, v, v - b)]) for g, b, v in pairs])
        return counts, norms

    counts, norms = tf.cond(tf.reduce_all(tf.math.is_finite(squares)), plain, recount)
    rows = tf.stack([norms[:, 0], counts[:, 0], norms[:, 1], norms[:, 2], counts[:, 1]], axis=1)
    grad_norm = combined_norm(norms[:, 0])
    applied_norm = grad_norm if applied is None else combined_norm(
        tf.stack([tf.sqrt(2.0 * tf.nn.l2_loss(_f32(a))) for a in applied]))
    return rows, grad_norm, applied_norm


def combined_norm(norms):
    """sqrt(sum(n**2)) scaled by the largest norm, so it overflows only when the result does."""
    tf, _ = tensorflow()
    peak = tf.reduce_max(norms)
    return peak * tf.sqrt(tf.reduce_sum(tf.square(tf.math.divide_no_nan(norms, peak))))


def any_nonfinite_count(tensor):
    """Number of non-finite entries; one sum on the healthy path.

    A sum is finite only if every entry is; a sum of finite entries that overflows
    takes the exact branch, which then counts 0.
    """
    tf, _ = tensorflow()
    tensor = tf.convert_to_tensor(tensor)
    if not tensor.dtype.is_floating:
        return tf.constant(0.0)
    probe = tf.reduce_sum(tf.cast(tensor, tf.float32))
    return tf.cond(tf.math.is_finite(probe), lambda: tf.constant(0.0), lambda: _nonfinite(tensor))


def _nonfinite(tensor):
    tf, _ = tensorflow()
    return tf.reduce_sum(tf.cast(tf.logical_not(tf.math.is_finite(tensor)), tf.float32))


def _scaled_norm(tensor):
    """L2 norm scaled by max |x|: finite whenever every entry is, even past float32's sum-of-squares range."""
    tf, _ = tensorflow()
    peak = tf.reduce_max(tf.abs(tensor))
    return peak * tf.sqrt(tf.reduce_sum(tf.square(tf.math.divide_no_nan(tensor, peak))))


def _f32(tensor):
    tf, _ = tensorflow()
    tensor = tf.convert_to_tensor(tensor)
    return tensor if tensor.dtype == tf.float32 else tf.cast(tensor, tf.float32)

