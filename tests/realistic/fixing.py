"""A buggy case's printed top fix, applied as the code it is, and whether the run then trains.

nanscope prints each fix as a snippet: a YAML `train:` block, a few lines of numpy on `x` and
`y`, a layer to put first, or code for the line that produced the first non-finite value, headed
by comment lines (where to change it) and followed by alternatives in comments. Its first
alternative (`first_alternative`) is run as code: merged into the run, executed on the data,
or executed inside the case's layer or loss at the line the rule names (each buggy layer and
loss in `models.py` / `losses.py` takes a `fix` callable that evaluates the snippet with the
line's own variables bound, as a user pasting it would). The fixed run is then trained with
plain Keras (`model.fit`) and judged as `--verify` judges a fix: it trains when it stays finite
and its final loss ends at least 1% below the trivial baseline, the loss of the best constant
prediction under the same loss on the same targets.
"""

import ast
import functools
import hashlib
import math

import numpy as np
import yaml

from nanscope.runtime import tensorflow
from nanscope.run.environment import dtype_policy

tf, keras = tensorflow()
# Steps each fixed run trains for: past 4x the latest failing step in the corpus (the focal loss at step 37).
STEPS = 200
MARGIN = 0.01
OPTIMIZERS = {"adam": keras.optimizers.Adam, "sgd": keras.optimizers.SGD, "rmsprop": keras.optimizers.RMSprop}


def first_alternative(fix):
    """The code of a fix's first alternative: from its first code line up to the next line that is only a comment
    (the heading comments, "# path: change this line", and the alternatives after it are left out)."""
    lines = fix.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() and not line.lstrip().startswith("#")), None)
    if start is None:
        raise ValueError(f"the fix has no code line:\n{fix}")
    end = next((i for i in range(start, len(lines)) if lines[i].lstrip().startswith("#")), len(lines))
    return "\n".join(lines[start:end])


def evaluate(code, names):
    """Run `code` with `names` bound; the value of its last line (an expression's, or the names it assigns)."""
    body = ast.parse(code).body
    namespace = {"tf": tf, "keras": keras, "np": np, **names}
    exec(compile(ast.Module(body[:-1], type_ignores=[]), "<fix>", "exec"), namespace)
    last = body[-1]
    if isinstance(last, ast.Expr):
        return eval(compile(ast.Expression(last.value), "<fix>", "eval"), namespace)
    exec(compile(ast.Module([last], type_ignores=[]), "<fix>", "exec"), namespace)
    target = last.targets[0] if isinstance(last, ast.Assign) else last.target
    if isinstance(target, ast.Tuple):
        return tuple(namespace[t.id] for t in target.elts)
    return namespace[target.id]


def layer_argument(code, name):
    """The value of keyword `name` in the layer call `code` (`keras.layers.Dense(..., dtype='float32')`)."""
    call = ast.parse(code).body[0].value
    value = next(k.value for k in call.keywords if k.arg == name)
    return eval(compile(ast.Expression(value), "<fix>", "eval"), {"tf": tf, "keras": keras})


def snippet(code):
    """A `fix` callable for a buggy layer or loss: `fix(**the line's variables)` evaluates `code` with them."""
    return lambda **names: evaluate(code, names)


class Run:
    """A run spec made concrete for plain Keras: its data, model and loss factories' arguments, its optimizer."""

    def __init__(self, doc, call, load_loss):
        train = doc["train"]
        self.x, self.y = call(doc["data"]["factory"], doc["data"]["args"])
        self.model_ref, self.model_args = doc["model"]["factory"], dict(doc["model"]["args"])
        self.loss, self.optimizer = load_loss(train["loss"]), dict(train["optimizer"])
        self.policy, self.batch, self.seed = train.get("mixed_precision"), doc["data"]["batch_size"], train["seed"]
        self.call, self.first_layer, self.wrap_optimizer = call, None, None

    def model(self):
        keras.utils.set_random_seed(self.seed)
        model = self.call(self.model_ref, self.model_args)
        return keras.Sequential([self.first_layer, model]) if self.first_layer is not None else model


def apply(run, site, code):
    """Apply the fix `code` to `run` at its `site` (see SITES)."""
    kind, _, where = site.partition(":")
    if kind == "train":  # a YAML block: `train: {optimizer: {...}}` merged into the run
        train = yaml.safe_load(code)["train"]
        run.optimizer.update(train.pop("optimizer", {}) or {})
        if "mixed_precision" in train:
            run.policy = train.pop("mixed_precision")
        assert not train, f"a train field the fix check does not apply: {train}"
    elif kind == "data":  # numpy on the training arrays
        run.x, run.y = evaluate(code + "\nx, y = x, y", {"x": run.x.copy(), "y": run.y.copy()})
    elif kind == "first-layer":  # a layer adapted on x, put first in the model
        run.first_layer = evaluate(code + "\nnorm", {"x": run.x})
    elif kind == "optimizer":  # `optimizer = Wrapper(optimizer)`
        run.wrap_optimizer = lambda optimizer: evaluate(code, {"optimizer": optimizer})
    elif kind == "model":  # code inside the layer that produced the first non-finite value
        run.model_args["fix"] = snippet(code)
    elif kind == "loss":  # code inside the loss function
        run.loss = functools.partial(run.loss, fix=snippet(code))
    elif kind == "layer-arg":  # `keras.layers.X(..., NAME=VALUE)`: the factory's argument NAME for that layer
        run.model_args[where] = layer_argument(code, where)
    else:
        raise ValueError(f"unknown fix site {site!r}")
    return run


def outcome(run, steps=STEPS):
    """{"finite", "final", "baseline", "trains"} of `run` trained with plain `model.fit` for `steps` steps."""
    with dtype_policy(run.policy):
        model = run.model()
        options = dict(run.optimizer)
        optimizer = OPTIMIZERS[options.pop("name")](**options)
        if run.wrap_optimizer is not None:
            optimizer = run.wrap_optimizer(optimizer)
        model.compile(optimizer, run.loss, steps_per_execution=10)
    per_epoch = math.ceil(len(run.x) / run.batch)
    history = model.fit(run.x, run.y, batch_size=run.batch, epochs=math.ceil(steps / per_epoch), shuffle=False,
                        verbose=0)
    prediction = tf.cast(model(run.x, training=False), tf.float32)
    final = float(_loss_value(run.loss, run.y, prediction))
    finite = all(math.isfinite(v) for v in history.history["loss"]) and math.isfinite(final)
    baseline = best_constant(run.loss, run.y, int(prediction.shape[-1]))
    return {"finite": finite, "final": final, "baseline": baseline,
            "trains": finite and final < baseline - MARGIN * abs(baseline)}


def _loss_value(loss, y, prediction):
    fn = keras.losses.get(loss) if isinstance(loss, str) else loss
    return tf.reduce_mean(fn(tf.constant(y), prediction))


# (repr of the loss, width, digest of the targets, steps, rate): (the loss, kept so that its repr's address is not
# reused, the baseline). Ten cases' fixed runs and the IRNN's ground truth share an MSE on the same targets.
_BASELINES = {}


def best_constant(loss, y, width, steps=1500, rate=0.1):
    """The lowest loss a constant prediction reaches on targets `y` (a `width`-wide output): Adam on the constant,
    in one graph, from 0 and from the targets' mean. Computed once per loss, targets and width."""
    y = np.asarray(y)
    key = (repr(loss), width, y.dtype.str, y.shape, hashlib.sha256(y.tobytes()).hexdigest(), steps, rate)
    if key not in _BASELINES:
        _BASELINES[key] = loss, _search_constant(loss, y, width, steps, rate)
    return _BASELINES[key][1]


def _search_constant(loss, y, width, steps, rate):
    targets, rows = tf.constant(y), len(y)

    @tf.function
    def search(start):
        constant = tf.fill((1, width), start)
        m, v, best = tf.zeros_like(constant), tf.zeros_like(constant), tf.constant(math.inf)
        for t in tf.range(1.0, steps + 1.0):
            with tf.GradientTape() as tape:
                tape.watch(constant)
                value = _loss_value(loss, targets, tf.broadcast_to(constant, (rows, width)))
            grad = tape.gradient(value, constant)
            grad = tf.where(tf.math.is_finite(grad), grad, 0.0)
            best = tf.where(tf.math.is_finite(value), tf.minimum(best, value), best)
            m, v = 0.9 * m + 0.1 * grad, 0.999 * v + 0.001 * grad * grad
            constant -= rate * (m / (1 - 0.9 ** t)) / (tf.sqrt(v / (1 - 0.999 ** t)) + 1e-7)
        return best

    return min(float(search(tf.constant(start, tf.float32))) for start in (0.0, float(np.mean(y))))
