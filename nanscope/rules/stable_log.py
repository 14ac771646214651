"""`stable-log`: a Log fed 0 or negative values, or its gradient 1/x overflowing."""

from typing import Any

from nanscope.rules.facts import Facts, FirstNonfinite
from nanscope.rules.operand import finding_data, operand, source_fix
from nanscope.rules.rule import Fixtures, Recommendation, Rule

STABLE_LOG = Rule(
    "stable-log",
    "Take the log of something that cannot be zero",
    "A Log op fed 0 or negative values (log(0) = -inf, log(x<0) = NaN), or its gradient 1/x overflowing.",
    "loss = keras.losses.CategoricalCrossentropy(from_logits=True)  # and drop the final softmax\n"
    "# a sigmoid output: keras.losses.BinaryCrossentropy(from_logits=True)\n"
    "# or take the log from the logits: tf.nn.log_softmax(logits)  /  tf.math.log_sigmoid(logits)",
)
RULES = (STABLE_LOG,)
FIXTURES = Fixtures(fires=("log-of-softmax-layer",), quiet=("cnn-softmax-onehot",))
# Log1p, Xlogy and Xlog1py are `avoid-poles`' (rules/poles.py): their fix keeps a parameter in its domain.
OPS = {"Log"}


def matches(first: FirstNonfinite, inputs: dict[str, Any], op: str | None) -> bool:
    """True for a log-like producer."""
    del first, inputs  # Unused
    return op in OPS


def finding(facts: Facts, first: FirstNonfinite, where: str, inputs: dict[str, Any]) -> Recommendation:
    """The Recommendation for a log of 0 or of a negative value."""
    del facts  # Unused
    why = "log(0) = -inf and log(x<0) = NaN" if first.phase != "backward" else "the gradient 1/x overflows near x = 0"
    evidence = [f"{where}: {first.op} fed {operand(inputs)}; {why}"]
    # Clipping p at 1e-7 keeps the value finite but its gradient is 0 wherever it clips: a hand-written BCE on a
    # saturated sigmoid (a GAN's discriminator) then stops learning. The log from the logits keeps the gradient.
    fix = source_fix(first, "tf.nn.log_softmax(logits)  # the log of a softmax, from its logits\n"
                            "# of a sigmoid: tf.math.log_sigmoid(logits); or a Keras loss with from_logits=True")
    return STABLE_LOG.recommend("error", evidence, fix, finding_data(first, inputs))
