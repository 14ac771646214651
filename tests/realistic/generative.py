"""Generative models in the keras-io style for the realistic corpus: each overrides `train_step`, so only the
`NanScope` callback can watch them (a trace-steps spec trains `model(x)` against `y`).

`VAE` is keras-io's "Variational AutoEncoder" on 8x8 images with a squared-error reconstruction; `GAN` its
"GAN overriding train_step" with the discriminator's binary cross-entropy written by hand on sigmoid outputs, as
users copy it. Fed raw pixel values (`images(scale=255)`, or 1000 for a sensor's counts) instead of 0-1 ones,
both go non-finite in their first step; fed 0-1 values, both train.
"""

from pathlib import Path

import numpy as np

from nanscope.model.factory import load_callable
from nanscope.runtime import tensorflow

tf, keras = tensorflow()
layers, ops = keras.layers, keras.ops
LATENT = 2
# keras-io's DCGAN discriminator and generator on 8x8 images, as the specs' generative models build them.
SPECS = Path(__file__).parents[1] / "specs" / "generative.py"
discriminator, generator = (load_callable(f"{SPECS}:{name}", SPECS.parent, "test")
                            for name in ("discriminator", "generator"))


def images(rows=64, seed=0, scale=1.0):
    """Blobs on 8x8: a bright square at a random place on a dim background, in [0, `scale`]."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 0.2, (rows, 8, 8, 1)).astype("float32")
    for i, (r, c) in enumerate(rng.integers(0, 5, (rows, 2))):
        x[i, r:r + 3, c:c + 3] = 0.9
    return x * np.float32(scale)


class Sampling(layers.Layer):
    """z = mean + exp(log_var / 2) * noise, the noise from a seeded generator."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.seed = keras.random.SeedGenerator(7)

    def call(self, inputs):
        z_mean, z_log_var = inputs
        return z_mean + ops.exp(0.5 * z_log_var) * keras.random.normal(ops.shape(z_mean), seed=self.seed)


def encoder():
    inputs = keras.Input((8, 8, 1))
    h = layers.Dense(16, activation="relu")(layers.Flatten()(inputs))
    z_mean, z_log_var = layers.Dense(LATENT, name="z_mean")(h), layers.Dense(LATENT, name="z_log_var")(h)
    return keras.Model(inputs, [z_mean, z_log_var, Sampling(name="sampling")([z_mean, z_log_var])], name="encoder")


def decoder():
    inputs = keras.Input((LATENT,))
    h = layers.Dense(16, activation="relu")(inputs)
    return keras.Model(inputs, layers.Reshape((8, 8, 1))(layers.Dense(64)(h)), name="decoder")


class VAE(keras.Model):
    """The encoder's mean and log-variance, a sample, the decoder's reconstruction; loss = squared error + KL."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.encoder, self.decoder = encoder(), decoder()
        self.loss_tracker = keras.metrics.Mean(name="loss")

    @property
    def metrics(self):
        return [self.loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = ops.mean(ops.sum(ops.square(data - self.decoder(z)), axis=(1, 2, 3)))
            kl = ops.mean(ops.sum(-0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var)), axis=1))
            loss = reconstruction + kl
        grads = tape.gradient(loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.loss_tracker.update_state(loss)
        return {"loss": self.loss_tracker.result()}


def bce(labels, logits):
    """Binary cross-entropy written by hand on sigmoid outputs: log(0) once a logit saturates the sigmoid."""
    p = ops.sigmoid(logits)
    return -ops.mean(labels * ops.log(p) + (1.0 - labels) * ops.log(1.0 - p))


class GAN(keras.Model):
    """Discriminator and generator, each with its own Adam; the step logs d_loss and g_loss."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.discriminator, self.generator = discriminator(), generator()
        self.seed = keras.random.SeedGenerator(1337)
        self.d_metric, self.g_metric = keras.metrics.Mean(name="d_loss"), keras.metrics.Mean(name="g_loss")

    def compile(self, d_optimizer, g_optimizer):
        super().compile()
        self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

    @property
    def metrics(self):
        return [self.d_metric, self.g_metric]

    def train_step(self, real):
        batch = ops.shape(real)[0]
        fake = self.generator(keras.random.normal((batch, LATENT), seed=self.seed))
        labels = ops.concatenate([ops.ones((batch, 1)), ops.zeros((batch, 1))], axis=0)
        with tf.GradientTape() as tape:
            d_loss = bce(labels, self.discriminator(ops.concatenate([fake, real], axis=0)))
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            fooled = self.discriminator(self.generator(keras.random.normal((batch, LATENT), seed=self.seed)))
            g_loss = bce(ops.zeros((batch, 1)), fooled)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_metric.update_state(d_loss)
        self.g_metric.update_state(g_loss)
        return {"d_loss": self.d_metric.result(), "g_loss": self.g_metric.result()}


def vae(learning_rate=1e-3):
    keras.utils.set_random_seed(0)
    model = VAE()
    model.compile(optimizer=keras.optimizers.Adam(learning_rate))
    return model


def gan(learning_rate=3e-4):
    keras.utils.set_random_seed(0)
    model = GAN()
    model.compile(keras.optimizers.Adam(learning_rate), keras.optimizers.Adam(learning_rate))
    return model
