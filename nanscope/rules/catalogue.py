"""One central table of rules, keyed by stable kebab-case ids.

A rule says what it detects, its title and its default fix. A detector that finds
evidence for a rule calls `recommend(rule_id, ...)`, which returns a
`Recommendation`: the rule's id and title plus the evidence measured in this run.
"""

from dataclasses import dataclass, field

SEVERITIES = ("error", "warning", "info")


@dataclass(frozen=True)
class Rule:
    """One diagnosis nanscope can make.

    Args:
        id: str. Stable kebab-case id; users and tests depend on it.
        title: str. What to do, as an imperative ("Lower the learning rate").
        detects: str. One sentence: the evidence that triggers it.
        fix: str. The default fix, as a YAML or code snippet.
    """

    id: str
    title: str
    detects: str
    fix: str

    @property
    def docs(self):
        """The rule's page, relative to the repository root."""
        return f"docs/rules/{self.id}.md"


@dataclass
class Recommendation:
    """A rule that fired in this run, with the evidence it cites.

    Args:
        id: str. The rule id.
        title: str. The rule title.
        severity: str. "error", "warning" or "info".
        evidence: list of str. Measured facts, each one line ("step 12: grad norm 3.1e+05").
        fix: str. The concrete fix for this run (a YAML/code snippet with computed values).
        verified: bool or None. Whether a re-run with the fix applied stayed finite (None: not tried).
        data: dict. Machine-readable evidence (values the message cites).
        verification: list of dict. Per applied fix: stayed finite, final and best loss vs the unfixed run.
        docs: str. The rule's documentation page.
    """

    id: str
    title: str
    severity: str
    evidence: list
    fix: str
    verified: bool | None = None
    data: dict = field(default_factory=dict)
    verification: list = field(default_factory=list)
    docs: str | None = None


RULES = {
    rule.id: rule
    for rule in (
        Rule(
            "clean-input-data",
            "Remove or impute the non-finite values in the input data",
            "NaN or Inf values in the batch fed to the model (phase `data`).",
            "x = np.nan_to_num(x, nan=0.0, posinf=0.0, neginf=0.0)  # or drop the rows: x[np.isfinite(x).all(axis=1)]",
        ),
        Rule(
            "drop-outlier-rows",
            "Drop or repair the rows that hold glitches",
            "A few rows with values far outside their column (a missing-value code such as 9999), "
            "in a batch whose loss spiked or went non-finite.",
            "bad = np.abs(y[:, 0] - np.median(y[:, 0])) > 10 * 1.4826 * mad   # robust z > 10\n"
            "x, y = x[~bad], y[~bad]   # or repair them (y[bad] = np.nan, then impute); do not standardise instead",
        ),
        Rule(
            "normalize-inputs",
            "Normalize the input features",
            "Input features far from unit scale.",
            "norm = keras.layers.Normalization(); norm.adapt(x)  # first layer of the model",
        ),
        Rule(
            "normalize-targets",
            "Scale the regression targets",
            "Regression targets with a large scale under an MSE-like loss.",
            "y_mean, y_std = y.mean(0), y.std(0); y = (y - y_mean) / y_std  # invert on predictions",
        ),
        Rule(
            "lower-learning-rate",
            "Lower the learning rate",
            "Update ratio |dw|/|w| far above ~1e-3, or loss and gradient norm growing geometrically from the start.",
            "train:\n  optimizer: {learning_rate: 0.001}",
        ),
        Rule(
            "clip-gradients",
            "Clip the gradients",
            "Gradient norm spikes or geometric growth of the gradient norm.",
            "train:\n  optimizer: {global_clipnorm: 1.0}",
        ),
        Rule(
            "bounded-activation",
            "Bound the activations",
            "Layer outputs (typically ReLU) growing toward the dtype's overflow bound, or overflowing.",
            "keras.layers.Dense(units, activation='relu6')  # or add keras.layers.LayerNormalization() after it",
        ),
        Rule(
            "stable-log",
            "Take the log of something that cannot be zero",
            "A Log op fed 0 or negative values (log(0) = -inf, log(x<0) = NaN), or its gradient 1/x overflowing.",
            "loss = keras.losses.CategoricalCrossentropy(from_logits=True)  # and drop the final softmax\n"
            "# or: tf.nn.log_softmax(logits)  /  tf.math.log(tf.clip_by_value(p, 1e-7, 1.0))",
        ),
        Rule(
            "stable-exp",
            "Keep exp() below its overflow bound",
            "An Exp op fed values past log(dtype max) (88.7 in float32, 11.1 in float16).",
            "y = tf.nn.softplus(x)  # instead of log(1 + exp(x))\n"
            "# or: tf.reduce_logsumexp(x)  /  tf.exp(x - tf.reduce_max(x))\n"
            "# or: tf.exp(tf.minimum(x, 80.0))  # 11.0 in float16 (log(65504) = 11.09)",
        ),
        Rule(
            "safe-division",
            "Keep denominators away from zero",
            "A RealDiv, Reciprocal or Rsqrt whose denominator holds exact zeros.",
            "y = a / (b + 1e-7)  # or tf.math.divide_no_nan(a, b); tf.math.rsqrt(v + 1e-7)",
        ),
        Rule(
            "masked-softmax",
            "Fill masked positions with a finite value and zero the rows with nothing to attend to",
            "A softmax over a row masked at every position (a -inf fill, an additive -inf mask, or a hand-written "
            "exp(x) * mask / sum) gives 0/0 = NaN.",
            "scores = tf.where(mask, scores, -1e9)  # float16: half the dtype's minimum, -32752\n"
            "weights = tf.nn.softmax(scores, axis=-1)\n"
            "weights = tf.where(tf.reduce_any(mask, axis=-1, keepdims=True), weights, 0.0)",
        ),
        Rule(
            "double-where",
            "Make the op's input safe inside the tf.where branch (the double where)",
            "A NaN gradient from an op whose forward value a tf.where threw away (e.g. `total / count` where "
            "count is 0): the untaken branch gets a zero gradient, and 0 times an infinite derivative is NaN.",
            "safe = tf.where(count > 0, count, 1.0)\nmean = tf.where(count > 0, total / safe, 0.0)",
        ),
        Rule(
            "safe-sqrt",
            "Keep sqrt() away from zero and negatives",
            "Sqrt of 0 (its gradient 0.5/sqrt(x) is infinite) or of negative values (NaN).",
            "y = tf.sqrt(x + 1e-7)  # or tf.sqrt(tf.maximum(x, 1e-7))",
        ),
        Rule(
            "loss-scaling",
            "Scale the loss under mixed precision",
            "A float16 value overflowing (> 65504) or gradients underflowing; a loss scale that collapses (most "
            "updates skipped).",
            "optimizer = keras.optimizers.LossScaleOptimizer(optimizer)  # dynamic loss scaling\n"
            "# or keep the overflowing layer in float32: keras.layers.Dense(..., dtype='float32')",
        ),
        Rule(
            "float32-layer",
            "Keep the overflowing layer in float32",
            "Under mixed precision with a LossScaleOptimizer already in use: a float16 value overflowing (> 65504), "
            "or a loss scale that collapses because the gradient overflows at every scale.",
            "keras.layers.Dense(..., dtype='float32')  # the layer that overflows keeps float32 under mixed_float16\n"
            "# or compute the op in float32: tf.exp(tf.cast(x, tf.float32))",
        ),
        Rule(
            "optimizer-epsilon",
            "Raise the optimizer's epsilon",
            "A non-finite update from finite gradients (e.g. Adam's epsilon underflowing in float16).",
            "train:\n  optimizer: {epsilon: 1.0e-4}",
        ),
        Rule(
            "fix-labels",
            "Make the labels fit the loss",
            "Labels outside what the loss expects: sparse labels outside [0, classes), one-hot rows that do not "
            "sum to 1, binary targets outside [0, 1].",
            "Check the label encoding: sparse losses want integers in [0, classes), categorical ones one-hot rows, "
            "binary ones targets in [0, 1]",
        ),
        Rule(
            "drop-constant-features",
            "Drop the constant features",
            "Input features with the same value in every row.",
            "x = x[:, x.std(axis=0) > 0]  # a constant feature carries no signal and divides by 0 when standardised",
        ),
        Rule(
            "weight-constraint",
            "Constrain the weight norms",
            "Weight norms growing steadily without bound.",
            "keras.layers.Dense(units, kernel_constraint=keras.constraints.MaxNorm(3.0))\n"
            "# or weight decay: train: {optimizer: {name: adamw, weight_decay: 1.0e-4}}",
        ),
    )
}


def recommend(rule_id, severity, evidence, fix=None, data=None):
    """A Recommendation for `rule_id` with this run's evidence; `fix` defaults to the rule's."""
    rule = RULES[rule_id]
    if severity not in SEVERITIES:
        raise ValueError(f"`severity` must be one of {SEVERITIES}. Received: severity={severity!r}")
    return Recommendation(rule.id, rule.title, severity, list(evidence), fix or rule.fix, None, dict(data or {}),
                          docs=rule.docs)
