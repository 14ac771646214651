"""Small real-world models and data for the realistic corpus: healthy ones, and ones with one planted bug each.

Every factory is plain Keras and numpy; the data is seeded. Each bug is one that users
report: a NaN row, a missing-value code, a log of a softmax, an exp that overflows, a
division by a count that can be 0, a sqrt of a zero distance, a too-large learning rate,
unscaled inputs or targets, float16 overflow, Adam's epsilon at 0, a fully masked
attention row, a division by zero inside a loss file, a tf.where whose discarded branch
has a NaN gradient, a relu RNN's state growing past float32's sqrt(max), a WGAN critic without its weight
clipping.
"""

import numpy as np

from nanscope.runtime import tensorflow

tf, keras = tensorflow()
VOCAB, LENGTH = 200, 12


# --- data -------------------------------------------------------------------------------------


def tokens(rows=320, seed=0, dtype="int32"):
    """Token ids in [1, VOCAB); the label is whether the sequence holds more 'low' tokens than 'high' ones."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(rows, LENGTH))
    y = ((x < VOCAB // 2).sum(axis=1) > LENGTH // 2).astype(np.int32)
    return x.astype(dtype), y


def images(rows=256, seed=0, channels=1, side=8, onehot=False, autoencode=False):
    """0-1 images: class 1 has a bright left half, class 0 a bright right half, on uniform noise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 0.5, size=(rows, side, side, channels))
    y = rng.integers(0, 2, size=rows)
    x[y == 1, :, : side // 2] += 0.5
    x[y == 0, :, side // 2:] += 0.5
    x = x.astype(np.float32)
    if autoencode:
        return x, x
    return x, (np.eye(2, dtype=np.float32)[y] if onehot else y.astype(np.int32))


def tabular(rows=320, features=10, seed=0, kind="regression", nan_rows=(), glitch_rows=(), x_scale=1.0,
            y_scale=1.0, y_shift=0.0):
    """Standardised features; a regression target (std ~1) or a binary label from a linear score."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, features))
    score = x @ (rng.standard_normal(features) / np.sqrt(features)) + 0.1 * rng.standard_normal(rows)
    x = (x_scale * x).astype(np.float32)
    x[list(nan_rows), 2] = np.nan
    if kind == "binary":
        return x, (score > 0).astype(np.float32)[:, None]
    y = (y_shift + y_scale * score)[:, None]
    y[list(glitch_rows)] = 9999.0
    return x, y.astype(np.float32)


def sequences(rows=256, steps=10, features=3, seed=0):
    """Random walks; the target is the mean of the last feature."""
    rng = np.random.default_rng(seed)
    x = np.cumsum(rng.standard_normal((rows, steps, features)) * 0.3, axis=1).astype(np.float32)
    return x, x[:, :, -1].mean(axis=1, keepdims=True).astype(np.float32)


def signals(rows=128, length=2048, seed=0, level=1.0):
    """Noisy 1-D sensor readings and the clean ones: a level plus three sinusoids, with white noise of std 0.1."""
    rng = np.random.default_rng(seed)
    t = np.linspace(0.0, 1.0, length)
    shape = (rows, 3, 1)
    waves = rng.uniform(0.05, 0.15, shape) * np.sin(2 * np.pi * rng.uniform(1, 8, shape) * t
                                                     + rng.uniform(0, 2 * np.pi, shape))
    y = (level + waves.sum(axis=1)).astype(np.float32)
    return (y + 0.1 * rng.standard_normal(y.shape)).astype(np.float32), y


def tokens_and_numbers(rows=320, seed=0):
    """Two inputs by name: token ids and three numeric features; a regression target from both."""
    x, _ = tokens(rows, seed)
    rng = np.random.default_rng(seed + 1)
    numbers = rng.standard_normal((rows, 3)).astype(np.float32)
    y = ((x < VOCAB // 2).mean(axis=1) + 0.5 * numbers[:, 0]).astype(np.float32)[:, None]
    return {"tokens": x, "numbers": numbers}, y


def two_targets(rows=320, seed=0):
    """Tabular features with a regression target and a 3-class label."""
    x, y = tabular(rows, seed=seed)
    label = np.digitize(y[:, 0], [-0.5, 0.5]).astype(np.int32)
    return x, {"value": y, "kind": label}


def padded(rows=256, seed=0, empty_rows=()):
    """Token ids with trailing padding (id 0); every row keeps a token unless listed in `empty_rows`."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(rows, LENGTH))
    lengths = rng.integers(2, LENGTH + 1, rows)
    x[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    x[list(empty_rows)] = 0
    y = (((x > 0) & (x < VOCAB // 2)).sum(axis=1) / np.maximum((x > 0).sum(axis=1), 1)).astype(np.float32)
    return x.astype(np.int32), y[:, None]


# --- healthy models ---------------------------------------------------------------------------


def token_classifier(dtype="int32"):
    ids = keras.Input((LENGTH,), dtype=dtype)
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 16)(ids))
    return keras.Model(ids, keras.layers.Dense(2)(keras.layers.Dense(16, activation="relu")(h)))


def token_conv():
    ids = keras.Input((LENGTH,))
    h = keras.layers.Conv1D(16, 3, activation="relu")(keras.layers.Embedding(VOCAB, 16)(ids))
    return keras.Model(ids, keras.layers.Dense(2)(keras.layers.GlobalMaxPooling1D()(h)))


def cnn(batch_norm=False, channels=1, classes=2, softmax=False):
    layers = [keras.Input((8, 8, channels)), keras.layers.Conv2D(8, 3, padding="same", activation="relu")]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers += [keras.layers.MaxPooling2D(), keras.layers.Conv2D(8, 3, activation="relu"), keras.layers.Flatten(),
               keras.layers.Dense(classes, activation="softmax" if softmax else None)]
    return keras.Sequential(layers)


def autoencoder():
    return keras.Sequential([keras.Input((8, 8, 1)), keras.layers.Flatten(), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(64, activation="sigmoid"), keras.layers.Reshape((8, 8, 1))])


def mlp(features=10, outputs=1, activation=None, units=32):
    return keras.Sequential([keras.Input((features,)), keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(units, activation="relu"),
                             keras.layers.Dense(outputs, activation=activation, dtype="float32")])


def gru():
    return keras.Sequential([keras.Input((10, 3)), keras.layers.GRU(8), keras.layers.Dense(1)])


def attention():
    """Self-attention over padded tokens with Keras' MultiHeadAttention and a padding mask."""
    ids = keras.Input((LENGTH,), dtype="int32")
    h = keras.layers.Embedding(VOCAB, 16)(ids)
    valid = ids > 0
    mask = valid[:, None, :] & valid[:, :, None] | tf.eye(LENGTH, dtype=tf.bool)[None]
    h = keras.layers.MultiHeadAttention(2, 8)(h, h, attention_mask=mask)
    return keras.Model(ids, keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(h)))


def tokens_and_numbers_model():
    ids, numbers = keras.Input((LENGTH,), name="tokens"), keras.Input((3,), name="numbers")
    h = keras.layers.GlobalAveragePooling1D()(keras.layers.Embedding(VOCAB, 8)(ids))
    h = keras.layers.Concatenate()([h, keras.layers.Dense(8, activation="relu")(numbers)])
    return keras.Model({"tokens": ids, "numbers": numbers}, keras.layers.Dense(1)(h))


def two_heads():
    x = keras.Input((10,))
    h = keras.layers.Dense(16, activation="relu")(x)
    return keras.Model(x, {"value": keras.layers.Dense(1, name="value")(h),
                           "kind": keras.layers.Dense(3, name="kind")(h)})


# --- buggy models -------------------------------------------------------------------------------


class Fixable(keras.layers.Layer):
    """A layer with one unsafe line; `fix(**that line's variables)`, when given, computes the line instead
    (`fixing.py` passes a printed fix's snippet)."""

    def __init__(self, fix=None, **kwargs):
        super().__init__(**kwargs)
        self.fix = fix


class LogProbabilities(Fixable):
    """log(softmax(x)) taken in two steps: a probability that underflows to 0 gives -inf."""

    def call(self, x):
        if self.fix:
            return self.fix(logits=x * 50.0)
        return tf.math.log(tf.nn.softmax(x * 50.0))


class ExpFeatures(Fixable):
    """exp of a linear score with no bound: overflows float32 once the score passes 88.7."""

    def call(self, x):
        if self.fix:
            return self.fix(x=x)
        return tf.exp(x)


class ShareOfTotal(Fixable):
    """Each activation as a share of the row's total relu activation: 0 / 0 for a row with none."""

    def call(self, x):
        x = tf.nn.relu(x)
        if self.fix:
            return self.fix(a=x, b=tf.reduce_sum(x, axis=-1, keepdims=True))
        return x / tf.reduce_sum(x, axis=-1, keepdims=True)


class Distance(Fixable):
    """Euclidean norm of the activations: its gradient is inf x 0 = NaN where every activation is 0."""

    def call(self, x):
        if self.fix:
            return self.fix(x=tf.reduce_sum(tf.square(x), axis=-1, keepdims=True))
        return tf.sqrt(tf.reduce_sum(tf.square(x), axis=-1, keepdims=True))


class MeanOfPositives(Fixable):
    """Mean of the positive activations, guarded by tf.where against rows with none: the forward value is
    finite, but the discarded branch's gradient (1 / count with count 0) is NaN."""

    def call(self, x):
        count = tf.reduce_sum(tf.cast(x > 0, x.dtype), axis=-1, keepdims=True)
        total = tf.reduce_sum(x, axis=-1, keepdims=True)
        if self.fix:
            return self.fix(count=count, total=total)
        return tf.where(count > 0, total / count, tf.zeros_like(total))


class FullyMaskedPooling(Fixable):
    """Attention pooling with padding filled by -inf: a padding-only row has no position left."""

    def __init__(self, fix=None, **kwargs):
        super().__init__(fix, **kwargs)
        self.embed, self.score = keras.layers.Embedding(VOCAB, 8), keras.layers.Dense(1)

    def call(self, ids):
        h = self.embed(ids)
        if self.fix:
            weights = self.fix(mask=ids > 0, scores=tf.squeeze(self.score(h), -1))
            return tf.reduce_sum(weights[..., None] * h, axis=1)
        scores = tf.where(ids > 0, tf.squeeze(self.score(h), -1), float("-inf"))
        return tf.reduce_sum(tf.nn.softmax(scores, axis=-1)[..., None] * h, axis=1)


def log_probabilities(fix=None):
    """A 3-class classifier whose output is log(softmax(logits / 0.02)), a sharp temperature, for an NLL loss."""
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(3), LogProbabilities(fix, name="log_probs")])


def exp_features(fix=None):
    large = keras.initializers.Constant(30.0)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(4, kernel_initializer=large),
                             ExpFeatures(fix, name="exp"), keras.layers.Dense(1)])


def share_of_total(fix=None):
    negative = keras.initializers.Constant(-1.0)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(3, bias_initializer=negative),
                             ShareOfTotal(fix, name="share"), keras.layers.Dense(1)])


def distance(fix=None):
    """A relu projection, then its Euclidean norm: a row whose 3 relu units are all 0 has a norm of exactly 0."""
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(3, activation="relu"),
                             Distance(fix, name="distance"), keras.layers.Dense(1)])


def mean_of_positives(fix=None):
    negative = keras.initializers.Constant(-0.5)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(3, bias_initializer=negative),
                             MeanOfPositives(fix, name="mean_pos"), keras.layers.Dense(1)])


def masked_pooling(fix=None):
    ids = keras.Input((LENGTH,), dtype="int32")
    return keras.Model(ids, keras.layers.Dense(1)(FullyMaskedPooling(fix, name="pool")(ids)))


def float16_overflow(dtype="mixed_float16"):
    """A float16 Dense (built without the mixed-precision policy, so nothing scales the loss) whose output
    passes float16's largest value 65504 in the forward pass: its kernel starts at a std of 1e4 (weights kept in
    another unit), and a BatchNormalization standardises its outputs. `dtype="float32"` is float32-layer's fix."""
    return keras.Sequential([keras.Input((10,)),
                             keras.layers.Dense(16, kernel_initializer=keras.initializers.RandomNormal(
                                 stddev=1e4, seed=0), dtype=dtype),
                             keras.layers.BatchNormalization(dtype="float32"),
                             keras.layers.Dense(1, dtype="float32")])


def denoiser(length=2048):
    """A 1-D convolutional denoiser whose convolutions compute in float16: each is built with
    `dtype="mixed_float16"` while the model itself keeps the float32 policy, so `model.compile` does not wrap the
    optimizer in a LossScaleOptimizer (it does so only for a model whose own policy is mixed_float16, and never
    with `auto_scale_loss=False` or in a custom loop)."""
    convolutions = [keras.layers.Conv1D(8, 5, padding="same", activation="relu", dtype="mixed_float16"),
                    keras.layers.Conv1D(8, 5, padding="same", activation="relu", dtype="mixed_float16"),
                    keras.layers.Conv1D(1, 5, padding="same", dtype="mixed_float16")]
    return keras.Sequential([keras.Input((length,)), keras.layers.Reshape((length, 1)), *convolutions,
                             keras.layers.Reshape((length,), dtype="float32")])


def irnn(activation="relu"):
    """Le et al.'s IRNN (a relu SimpleRNN whose recurrent kernel starts at the identity) with its last state
    layer-normalised before the head: the loss does not see the state's scale, so nothing stops it from growing
    as the recurrent kernel drifts past the identity; once it passes float32's sqrt(max) the LayerNormalization's
    variance overflows and its output is a constant. `activation="relu6"` is bounded-activation's fix."""
    return keras.Sequential([keras.Input((None, 3)),
                             keras.layers.SimpleRNN(32, activation=activation,
                                                    recurrent_initializer=keras.initializers.Identity(), name="rnn"),
                             keras.layers.LayerNormalization(), keras.layers.Dense(1)])


def critic_samples(rows=320, seed=0):
    """A WGAN critic's batch: 'real' rows (features shifted by 1) labelled +1 and generated rows labelled -1,
    interleaved."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((rows, 10)).astype(np.float32)
    y = np.where(np.arange(rows) % 2 == 0, 1.0, -1.0).astype(np.float32)[:, None]
    x[y[:, 0] > 0] += 1.0
    return x, y


def critic(kernel_constraint=None):
    """A WGAN critic (Arjovsky et al. 2017) without the weight clipping that keeps it Lipschitz: its loss
    (`losses.wasserstein`) is linear in the score, so larger weights always lower it. `kernel_constraint` (on every
    Dense) is weight-constraint's fix."""
    return keras.Sequential([keras.Input((10,)),
                             keras.layers.Dense(32, activation="relu", kernel_constraint=kernel_constraint),
                             keras.layers.Dense(32, activation="relu", kernel_constraint=kernel_constraint),
                             keras.layers.Dense(1, kernel_constraint=kernel_constraint)])


def half_dead(shape, dtype=None):
    """A bias of -100 for the first half of the units (dead relus: their gradient is exactly 0) and 0 for the rest."""
    return tf.constant([-100.0] * (shape[0] // 2) + [0.0] * (shape[0] - shape[0] // 2), dtype or "float32")


def dead_relu():
    """Half of the relu units dead from the start: Adam's update of their weights is 0 / (sqrt(0) + epsilon)."""
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(8, activation="relu", bias_initializer=half_dead),
                             keras.layers.Dense(1)])


# --- unsafe ops without a guard, and the same models with the rule's fix ------------------------------------


def counts(rows=320, seed=0):
    """Tabular features and Poisson counts whose log-rate is linear in them."""
    x, y = tabular(rows, seed=seed)
    rng = np.random.default_rng(seed + 2)
    return x, rng.poisson(np.exp(0.5 * y)).astype(np.float32)


def prices(rows=320, seed=0):
    """Tabular features and positive prices spread over orders of magnitude (an RMSLE target)."""
    x, y = tabular(rows, seed=seed)
    return x, np.exp(2.0 * y).astype(np.float32)


def classes(rows=320, seed=0):
    """Tabular features and a 3-class label from a linear score."""
    x, y = tabular(rows, seed=seed)
    return x, np.digitize(y[:, 0], [-0.5, 0.5]).astype(np.int32)


class PowerMean(Fixable):
    """Generalised-mean (GeM) pooling over the features with a learnable exponent p: mean(x^p)^(1/p). Without
    GeM's clamp a negative mean to the power 1/p is NaN. A `fix` replaces both pows of the line."""

    def __init__(self, clamp=False, fix=None, **kwargs):
        super().__init__(fix, **kwargs)
        self.clamp = clamp

    def build(self, shape):
        self.p = self.add_weight(shape=(), initializer=keras.initializers.Constant(3.0), name="p")

    def call(self, x):
        if self.clamp:
            x = tf.maximum(x, 1e-6)  # safe-pow's fix: the base floored above 0
        if self.fix:
            return self.fix(x=tf.reduce_mean(self.fix(x=x, y=self.p), axis=-1, keepdims=True), y=1.0 / self.p)
        return tf.pow(tf.reduce_mean(tf.pow(x, self.p), axis=-1, keepdims=True), 1.0 / self.p)


class ArcMargin(Fixable):
    """ArcFace's additive angular margin on a 2-D embedding (as in the paper's toy figure): 4 * cos(theta + 0.3),
    with theta = acos of the cosine between the embedding and each class centre."""

    def __init__(self, classes=3, clamp=False, fix=None, **kwargs):
        super().__init__(fix, **kwargs)
        self.classes, self.clamp = classes, clamp

    def build(self, shape):
        self.centres = self.add_weight(shape=(shape[-1], self.classes), initializer="identity", name="centres")

    def call(self, e):
        cos = tf.matmul(tf.math.l2_normalize(e, axis=-1), tf.math.l2_normalize(self.centres, axis=0))
        if self.clamp:
            cos = tf.clip_by_value(cos, -1.0 + 1e-7, 1.0 - 1e-7)  # clamp-inverse-trig's fix
        if self.fix:
            return 4.0 * tf.cos(self.fix(x=cos) + 0.3)
        return 4.0 * tf.cos(tf.acos(cos) + 0.3)


class FilledPooling(Fixable):
    """Attention pooling over padded tokens whose padding scores are filled with `fill`: +inf is a sign slip
    (softmax then gives inf - inf = NaN in every padded row); -1e9 is the masked fill that works."""

    def __init__(self, fill=float("inf"), fix=None, **kwargs):
        super().__init__(fix, **kwargs)
        self.fill = fill
        self.embed, self.score = keras.layers.Embedding(VOCAB, 8), keras.layers.Dense(1)

    def call(self, ids):
        h = self.embed(ids)
        if self.fix:
            weights = self.fix(mask=ids > 0, scores=tf.squeeze(self.score(h), -1))
            return tf.reduce_sum(weights[..., None] * h, axis=1)
        scores = tf.where(ids > 0, tf.squeeze(self.score(h), -1), self.fill)
        return tf.reduce_sum(tf.nn.softmax(scores, axis=-1)[..., None] * h, axis=1)


class CompoundGrowth(Fixable):
    """The compound growth of 128 quarterly rates (1 + relu(r)), multiplied out: the product overflows float32.
    In log space (`log_space`) it is their sum of log1p."""

    def __init__(self, log_space=False, fix=None, **kwargs):
        super().__init__(fix, **kwargs)
        self.log_space = log_space

    def call(self, r):
        if self.log_space:
            return tf.reduce_sum(tf.math.log1p(tf.nn.relu(r)), axis=-1, keepdims=True)  # guard-op's form
        if self.fix:
            return self.fix(x=1.0 + tf.nn.relu(r))
        return tf.reduce_prod(1.0 + tf.nn.relu(r), axis=-1, keepdims=True)


def gem(clamp=False, fix=None):
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(8), PowerMean(clamp, fix, name="gem"),
                             keras.layers.Dense(1)])


def arcface(clamp=False, fix=None):
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(3, activation="relu"),
                             ArcMargin(3, clamp, fix, name="arc")])


def filled_pooling(fill=float("inf"), fix=None):
    ids = keras.Input((LENGTH,), dtype="int32")
    return keras.Model(ids, keras.layers.Dense(1)(FilledPooling(fill, fix, name="pool")(ids)))


def compound_growth(log_space=False, fix=None):
    large = keras.initializers.RandomNormal(stddev=3.0, seed=0)
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(128, kernel_initializer=large),
                             CompoundGrowth(log_space, fix, name="growth"), keras.layers.BatchNormalization(),
                             keras.layers.Dense(1)])


def linear_head(outputs=1):
    """A relu MLP whose linear head starts with large weights: its first predictions reach below -1."""
    return keras.Sequential([keras.Input((10,)), keras.layers.Dense(32, activation="relu"),
                             keras.layers.Dense(outputs, kernel_initializer=keras.initializers.RandomNormal(
                                 stddev=1.0, seed=0))])
