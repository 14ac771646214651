"""A loss file with the bug users report most in hand-written losses: a mean over a count that can be 0."""

import tensorflow as tf


def large_target_mse(y_true, y_pred, fix=None):
    """MSE over the rows whose target is above 2 (the tail, 2.5% of the rows), divided by how many there are:
    0 / 0 in a batch that has none."""
    mask = tf.cast(y_true > 2.0, y_pred.dtype)
    if fix:
        return fix(a=tf.reduce_sum(mask * tf.square(y_true - y_pred)), b=tf.reduce_sum(mask))
    return tf.reduce_sum(mask * tf.square(y_true - y_pred)) / tf.reduce_sum(mask)


def focal_gamma_half(y_true, y_pred, fix=None):
    """Binary focal loss with gamma 0.5 on sigmoid outputs (clipped below for the log only): once p_t rounds to 1,
    the gradient of (1 - p_t)^0.5 is 0.5 / sqrt(0) = inf."""
    p = tf.clip_by_value(y_pred, 1e-7, 1.0)
    p_t = y_true * p + (1 - y_true) * (1 - p)
    if fix:
        return tf.reduce_mean(-fix(x=1.0 - p_t, y=0.5) * tf.math.log(tf.maximum(p_t, 1e-7)))
    return tf.reduce_mean(-tf.pow(1.0 - p_t, 0.5) * tf.math.log(tf.maximum(p_t, 1e-7)))


def focal_gamma_half_floored(y_true, y_pred):
    """The same focal loss with safe-pow's fix: the base of the power floored above 0."""
    p = tf.clip_by_value(y_pred, 1e-7, 1.0)
    p_t = y_true * p + (1 - y_true) * (1 - p)
    return tf.reduce_mean(-tf.pow(tf.maximum(1.0 - p_t, 1e-6), 0.5) * tf.math.log(tf.maximum(p_t, 1e-7)))


def _negative_binomial(y_true, y_pred, dispersion):
    mu, r = tf.exp(y_pred[:, :1]), dispersion(y_pred[:, 1:])
    ll = (tf.math.lgamma(y_true + r) - tf.math.lgamma(r) - tf.math.lgamma(y_true + 1.0)
          + r * tf.math.log(r / (r + mu)) + y_true * tf.math.log(mu / (r + mu)))
    return -tf.reduce_mean(ll)


def negative_binomial_relu(y_true, y_pred, fix=None):
    """Negative-binomial NLL whose dispersion r comes from a relu: lgamma(0) = inf wherever r is 0."""
    return _negative_binomial(y_true, y_pred, (lambda raw: fix(raw=raw)) if fix else tf.nn.relu)


def negative_binomial_softplus(y_true, y_pred):
    """The same NLL with avoid-poles' fix: r = softplus(raw) + 1e-6."""
    return _negative_binomial(y_true, y_pred, lambda raw: tf.nn.softplus(raw) + 1e-6)


def poisson_relu(y_true, y_pred, fix=None):
    """Poisson NLL with the rate straight from a relu: xlogy(y, 0) = -inf where the count is not 0."""
    rate = fix(raw=y_pred) if fix else tf.nn.relu(y_pred)
    return tf.reduce_mean(rate - tf.math.xlogy(y_true, rate))


def poisson_softplus(y_true, y_pred):
    """The same NLL with avoid-poles' fix: rate = softplus(raw) + 1e-6."""
    rate = tf.nn.softplus(y_pred) + 1e-6
    return tf.reduce_mean(rate - tf.math.xlogy(y_true, rate))


def rmsle(y_true, y_pred, fix=None):
    """Root mean squared log error on a linear head: log1p of a prediction below -1 is NaN."""
    if fix:
        return tf.sqrt(tf.reduce_mean(tf.square(fix(y_pred=y_pred) - tf.math.log1p(y_true))))
    return tf.sqrt(tf.reduce_mean(tf.square(tf.math.log1p(y_pred) - tf.math.log1p(y_true))))


def rmsle_softplus(y_true, y_pred):
    """The same loss with avoid-poles' fix: log1p of a softplus prediction."""
    return tf.sqrt(tf.reduce_mean(tf.square(tf.math.log1p(tf.nn.softplus(y_pred)) - tf.math.log1p(y_true))))


def mape(y_true, y_pred, fix=None):
    """Mean absolute percentage error over counts that can be 0: |y - p| / |y| is inf there."""
    if fix:
        return tf.reduce_mean(fix(a=tf.abs(y_true - y_pred), b=tf.abs(y_true)))
    return tf.reduce_mean(tf.abs(y_true - y_pred) / tf.abs(y_true))


def mape_floored(y_true, y_pred):
    """The same MAPE with safe-division's fix: the denominator floored at the counts' unit, 1."""
    return tf.reduce_mean(tf.abs(y_true - y_pred) / tf.maximum(tf.abs(y_true), 1.0))


def wasserstein(y_true, y_pred):
    """The WGAN critic's loss: -mean(label * score), label +1 for a real row and -1 for a generated one. It has no
    minimum: it falls without bound as the critic's weights grow."""
    return -tf.reduce_mean(y_true * y_pred)


def total_squared_error(y_true, y_pred):
    """The batch's total squared error, summed over every row and position as TF1-era code writes it
    (`tf.nn.l2_loss` is half of it) rather than averaged."""
    return tf.reduce_sum(tf.square(y_true - y_pred))
