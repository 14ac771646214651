"""`stable-log`: a Log fed 0 or negative values, or its gradient 1/x overflowing."""

from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Rule

STABLE_LOG = Rule(
    "stable-log",
    "Take the log of something that cannot be zero",
    "A Log op fed 0 or negative values (log(0) = -inf, log(x<0) = NaN), or its gradient 1/x overflowing.",
    "loss = keras.losses.CategoricalCrossentropy(from_logits=True)  # and drop the final softmax\n"
    "# or: tf.nn.log_softmax(logits)  /  tf.math.log(tf.clip_by_value(p, 1e-7, 1.0))",
)
RULES = (STABLE_LOG,)
FIXTURES = Fixtures(fires=("log-of-softmax-layer",), quiet=("cnn-softmax-onehot",))
# Log1p, Xlogy and Xlog1py are `avoid-poles`' (rules/poles.py): their fix keeps a parameter in its domain.
OPS = {"Log"}


def matches(first, inputs, op):
    """True for a log-like producer."""
    return op in OPS


def finding(facts, first, where, inputs):
    """The Recommendation for a log of 0 or of a negative value."""
    why = "log(0) = -inf and log(x<0) = NaN" if first.phase != "backward" else "the gradient 1/x overflows near x = 0"
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; {why}"]
    fix = source_fix(first, "tf.math.log(tf.clip_by_value(p, 1e-7, 1.0))  # or tf.nn.log_softmax(logits), "
                            "or a Keras loss with from_logits=True")
    return STABLE_LOG.recommend("error", evidence, fix, finding_data(first, inputs))
