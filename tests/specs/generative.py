"""Small generative models in the keras-io style: each overrides `train_step`.

`VAE` (keras-io "Variational AutoEncoder") builds its encoder and decoder and never
defines `call`, so the model itself is never built; `CallingVAE` adds the `call` that
some copies of the example have. `GAN` (keras-io "DCGAN ... overriding train_step")
has its own `compile(d_optimizer, g_optimizer, loss_fn)`. Images are 8x8x1.
"""

import keras
import numpy as np
import tensorflow as tf
from keras import layers, ops

LATENT = 2


class Sampling(layers.Layer):
    """z = mean + exp(log_var / 2) * noise; the noise unseeded, as in the example.

    draw: "legacy" (`tf.keras.backend.random_normal`, whose seed comes from numpy's global
    generator each time it is traced) or "keras" (`keras.random.normal(seed=None)`, Keras'
    global SeedGenerator).
    """

    def __init__(self, draw="legacy", **kwargs):
        super().__init__(**kwargs)
        self.draw = draw

    def call(self, inputs):
        z_mean, z_log_var = inputs
        if self.draw == "legacy":
            epsilon = tf.keras.backend.random_normal(shape=tf.shape(z_mean))
        else:
            epsilon = keras.random.normal(ops.shape(z_mean))
        return z_mean + ops.exp(0.5 * z_log_var) * epsilon


def encoder(draw="legacy"):
    inputs = keras.Input((8, 8, 1))
    h = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(inputs)
    h = layers.Dense(16, activation="relu")(layers.Flatten()(h))
    z_mean = layers.Dense(LATENT, name="z_mean")(h)
    z_log_var = layers.Dense(LATENT, name="z_log_var")(h)
    return keras.Model(inputs, [z_mean, z_log_var, Sampling(draw)([z_mean, z_log_var])], name="encoder")


def decoder():
    inputs = keras.Input((LATENT,))
    h = layers.Reshape((4, 4, 4))(layers.Dense(4 * 4 * 4, activation="relu")(inputs))
    h = layers.Conv2DTranspose(4, 3, strides=2, padding="same", activation="relu")(h)
    return keras.Model(inputs, layers.Conv2DTranspose(1, 3, padding="same", activation="sigmoid")(h), name="decoder")


class VAE(keras.Model):
    def __init__(self, encoder, decoder, **kwargs):
        super().__init__(**kwargs)
        self.encoder = encoder
        self.decoder = decoder
        self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
        self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
        self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

    @property
    def metrics(self):
        return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

    def train_step(self, data):
        with tf.GradientTape() as tape:
            z_mean, z_log_var, z = self.encoder(data)
            reconstruction = self.decoder(z)
            reconstruction_loss = ops.mean(ops.sum(keras.losses.binary_crossentropy(data, reconstruction), axis=(1, 2)))
            kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
            kl_loss = ops.mean(ops.sum(kl_loss, axis=1))
            total_loss = reconstruction_loss + kl_loss
        grads = tape.gradient(total_loss, self.trainable_weights)
        self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
        self.total_loss_tracker.update_state(total_loss)
        self.reconstruction_loss_tracker.update_state(reconstruction_loss)
        self.kl_loss_tracker.update_state(kl_loss)
        return {"loss": self.total_loss_tracker.result(),
                "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                "kl_loss": self.kl_loss_tracker.result()}


class CallingVAE(VAE):
    def call(self, inputs):
        return self.decoder(self.encoder(inputs)[2])


def discriminator():
    inputs = keras.Input((8, 8, 1))
    h = layers.LeakyReLU(0.2)(layers.Conv2D(8, 3, strides=2, padding="same")(inputs))
    return keras.Model(inputs, layers.Dense(1)(layers.GlobalMaxPooling2D()(h)), name="discriminator")


def generator():
    inputs = keras.Input((LATENT,))
    h = layers.Reshape((4, 4, 8))(layers.LeakyReLU(0.2)(layers.Dense(4 * 4 * 8)(inputs)))
    h = layers.LeakyReLU(0.2)(layers.Conv2DTranspose(8, 4, strides=2, padding="same")(h))
    return keras.Model(inputs, layers.Conv2D(1, 3, padding="same", activation="sigmoid")(h), name="generator")


class GAN(keras.Model):
    def __init__(self, discriminator, generator, latent_dim=LATENT):
        super().__init__()
        self.discriminator = discriminator
        self.generator = generator
        self.latent_dim = latent_dim
        self.seed_generator = keras.random.SeedGenerator(1337)

    def compile(self, d_optimizer, g_optimizer, loss_fn):
        super().compile()
        self.d_optimizer = d_optimizer
        self.g_optimizer = g_optimizer
        self.loss_fn = loss_fn
        self.d_loss_metric = keras.metrics.Mean(name="d_loss")
        self.g_loss_metric = keras.metrics.Mean(name="g_loss")

    @property
    def metrics(self):
        return [self.d_loss_metric, self.g_loss_metric]

    def train_step(self, real_images):
        batch_size = ops.shape(real_images)[0]
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        generated_images = self.generator(random_latent_vectors)
        combined_images = ops.concatenate([generated_images, real_images], axis=0)
        labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
        labels += 0.05 * keras.random.uniform(ops.shape(labels), seed=self.seed_generator)
        with tf.GradientTape() as tape:
            predictions = self.discriminator(combined_images)
            d_loss = self.loss_fn(labels, predictions)
        grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
        self.d_optimizer.apply_gradients(zip(grads, self.discriminator.trainable_weights))
        random_latent_vectors = keras.random.normal(shape=(batch_size, self.latent_dim), seed=self.seed_generator)
        misleading_labels = ops.zeros((batch_size, 1))
        with tf.GradientTape() as tape:
            predictions = self.discriminator(self.generator(random_latent_vectors))
            g_loss = self.loss_fn(misleading_labels, predictions)
        grads = tape.gradient(g_loss, self.generator.trainable_weights)
        self.g_optimizer.apply_gradients(zip(grads, self.generator.trainable_weights))
        self.d_loss_metric.update_state(d_loss)
        self.g_loss_metric.update_state(g_loss)
        return {"d_loss": self.d_loss_metric.result(), "g_loss": self.g_loss_metric.result()}


def images(rows=64, seed=0):
    """Blobs in [0, 1] on 8x8: a bright square at a random place on a dim background."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.0, 0.2, (rows, 8, 8, 1)).astype("float32")
    for i, (r, c) in enumerate(rng.integers(0, 5, (rows, 2))):
        x[i, r:r + 3, c:c + 3] = 0.9
    return x


def vae(calling=False, draw="legacy", learning_rate=1e-3):
    keras.utils.set_random_seed(0)
    model = (CallingVAE if calling else VAE)(encoder(draw), decoder())
    model.compile(optimizer=keras.optimizers.Adam(learning_rate))
    return model


def gan():
    keras.utils.set_random_seed(0)
    model = GAN(discriminator(), generator())
    model.compile(d_optimizer=keras.optimizers.Adam(3e-4), g_optimizer=keras.optimizers.Adam(3e-4),
                  loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return model
