"""Attention pooling over padded token ids, with the mask applied the ways real code applies it.

Token id 0 is padding. `padded_tokens` puts padding-only rows at known dataset rows
(`EMPTY_ROWS`), so a softmax over such a row has no valid position. The line that turns
the masked row into NaN is tagged `# producer: <variant>`; the intended -inf fill is
tagged `# fill: <variant>`.
"""

import numpy as np
import keras
import tensorflow as tf

EMPTY_ROWS = (3, 10)
VOCAB, LENGTH, WIDTH = 20, 6, 8


class MaskedPooling(keras.layers.Layer):
    """Softmax-weighted mean of token embeddings over the non-padding positions.

    Args:
        variant: str. How the mask is applied: "where" (tf.where fill, then tf.nn.softmax),
            "additive" (an additive -inf bias), "handwritten" (exp * mask / sum),
            "finite" (a -1e9 fill and zeroed empty rows: the fix), "causal" (self-attention
            with a causal mask that masks the diagonal too: query 0 sees nothing).
    """

    def __init__(self, variant="where", **kwargs):
        super().__init__(**kwargs)
        self.variant = variant
        self.embed = keras.layers.Embedding(VOCAB, WIDTH)
        self.score = keras.layers.Dense(1) if variant != "causal" else None

    def call(self, tokens):
        h = self.embed(tokens)
        valid = tokens != 0
        if self.variant == "causal":
            return self._causal(h)
        scores = tf.squeeze(self.score(h), -1)
        if self.variant == "where":
            scores = tf.where(valid, scores, float("-inf"))  # fill: where
            weights = tf.nn.softmax(scores, axis=-1)  # producer: where
        elif self.variant == "additive":
            bias = tf.where(valid, 0.0, float("-inf"))  # fill: additive
            weights = tf.nn.softmax(scores + bias, axis=-1)  # producer: additive
        elif self.variant == "handwritten":
            e = tf.exp(scores) * tf.cast(valid, scores.dtype)
            weights = e / tf.reduce_sum(e, axis=-1, keepdims=True)  # producer: handwritten
        else:
            scores = tf.where(valid, scores, -1e9)
            any_valid = tf.reduce_any(valid, axis=-1, keepdims=True)
            weights = tf.where(any_valid, tf.nn.softmax(scores, axis=-1), 0.0)
        return tf.reduce_sum(weights[..., None] * h, axis=1)

    def _causal(self, h):
        scores = tf.matmul(h, h, transpose_b=True) / np.sqrt(WIDTH)
        length = tf.shape(h)[1]
        allowed = tf.range(length)[None, :] < tf.range(length)[:, None]  # the bug: < where <= was meant
        scores = tf.where(allowed, scores, float("-inf"))  # fill: causal
        weights = tf.nn.softmax(scores, axis=-1)  # producer: causal
        return tf.reduce_mean(tf.matmul(weights, h), axis=1)


def pooling_model(variant="where"):
    tokens = keras.Input((LENGTH,), dtype="int32")
    pooled = MaskedPooling(variant, name="pool")(tokens)
    return keras.Model(tokens, keras.layers.Dense(1, name="head")(pooled))


def padded_tokens(rows=64, empty=EMPTY_ROWS):
    """Token ids with trailing padding (every row keeps at least one token, except the `empty` rows)."""
    rng = np.random.default_rng(3)
    tokens = rng.integers(1, VOCAB, (rows, LENGTH)).astype("int32")
    lengths = rng.integers(1, LENGTH + 1, rows)
    tokens[np.arange(LENGTH)[None, :] >= lengths[:, None]] = 0
    tokens[list(empty)] = 0
    y = (tokens != 0).sum(axis=1, keepdims=True).astype("float32") / LENGTH
    return tokens, y
