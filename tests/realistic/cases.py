"""The realistic corpus: healthy runs, and runs with one planted bug each and the rule that names it.

Each case is a run spec (as a dict) over `models.py`. A buggy case names the rule that
must rank in the top 2 at warning or error level; a healthy case must get no finding at
warning or error level. Whether a case really is healthy or buggy is checked in
`test_corpus.py` with plain Keras (`model.fit`) and numpy, not with nanscope.
"""

from pathlib import Path

HERE = Path(__file__).parent
MODELS, LOSSES = HERE / "models.py", HERE / "losses.py"
SPARSE = {"name": "sparse_categorical_crossentropy", "from_logits": True}


def spec(model, data, loss="mse", optimizer=None, steps=40, model_args=None, data_args=None, **train):
    return {
        "model": {"factory": f"{MODELS}:{model}", "args": model_args or {}},
        "data": {"factory": f"{MODELS}:{data}", "args": data_args or {}, "batch_size": 32, "shuffle": False},
        "train": {"loss": loss, "optimizer": optimizer or {"name": "adam", "learning_rate": 0.003}, "steps": steps,
                  "seed": 0, **train},
    }


HEALTHY = {
    "token-ids-int32": spec("token_classifier", "tokens", SPARSE),
    "token-ids-float-conv1d": spec("token_conv", "tokens", SPARSE, data_args={"dtype": "float32"}),
    "cnn-0-1-images": spec("cnn", "images", SPARSE),
    "cnn-batchnorm-sgd-momentum": spec("cnn", "images", SPARSE, {"name": "sgd", "learning_rate": 0.05, "momentum": 0.9},
                                       model_args={"batch_norm": True}),
    "cnn-softmax-onehot": spec("cnn", "images", "categorical_crossentropy", model_args={"softmax": True},
                               data_args={"onehot": True}),
    "autoencoder-0-1-images": spec("autoencoder", "images", "binary_crossentropy",
                                   {"name": "adam", "learning_rate": 0.01}, data_args={"autoencode": True}),
    "tabular-regression-adam": spec("mlp", "tabular"),
    "tabular-binary-sigmoid": spec("mlp", "tabular", "binary_crossentropy", model_args={"activation": "sigmoid"},
                                   data_args={"kind": "binary"}),
    "float16-loss-scaling": spec("mlp", "tabular", mixed_precision="mixed_float16"),
    "attention-partial-masks": spec("attention", "padded"),
    "tokens-and-numbers-inputs": spec("tokens_and_numbers_model", "tokens_and_numbers"),
    "two-heads-regression-and-class": spec("two_heads", "two_targets", {"value": "mse", "kind": SPARSE}),
    "gru-sequences": spec("gru", "sequences", optimizer={"name": "adam", "learning_rate": 0.01}),
    "tabular-huber-rmsprop": spec("mlp", "tabular", "huber", {"name": "rmsprop", "learning_rate": 0.001}),
    # The buggy unsafe-op cases below with their rule's fix applied: each must train and stay quiet.
    "gem-pooling-clamped": spec("gem", "tabular", model_args={"clamp": True}),
    "focal-loss-gamma-half-floored": spec("mlp", "tabular", f"{LOSSES}:focal_gamma_half_floored",
                                          {"name": "adam", "learning_rate": 0.01}, steps=80,
                                          model_args={"activation": "sigmoid"}, data_args={"kind": "binary"}),
    "arcface-2d-clamped": spec("arcface", "classes", SPARSE, model_args={"clamp": True}),
    "negative-binomial-softplus-dispersion": spec("linear_head", "counts", f"{LOSSES}:negative_binomial_softplus",
                                                  model_args={"outputs": 2}),
    "poisson-softplus-rate": spec("linear_head", "counts", f"{LOSSES}:poisson_softplus"),
    "rmsle-softplus-head": spec("linear_head", "prices", f"{LOSSES}:rmsle_softplus"),
    "attention-pooling-finite-fill": spec("filled_pooling", "padded", model_args={"fill": -1e9}),
    "mape-floored-at-the-unit": spec("linear_head", "counts", f"{LOSSES}:mape_floored"),
    "compound-growth-log-space": spec("compound_growth", "tabular", model_args={"log_space": True}),
    "irnn-relu6-layer-norm": spec("irnn", "sequences", "mse", {"name": "adam", "learning_rate": 0.01}, steps=64,
                                  model_args={"activation": "relu6"}, data_args={"steps": 100}),
    # The float16 denoiser below with loss-scaling's fix: Keras' LossScaleOptimizer, as `model.compile` adds it under
    # the mixed_float16 policy, halves its scale from 2^15 to 0.5 over the first 16 steps and then trains.
    "float16-denoiser-loss-scaling": spec("denoiser", "signals", f"{LOSSES}:total_squared_error",
                                          mixed_precision="mixed_float16"),
    "wgan-critic-max-norm": spec("critic", "critic_samples", f"{LOSSES}:wasserstein",
                                 {"name": "sgd", "learning_rate": 0.01}, steps=160,
                                 model_args={"kernel_constraint": {"class_name": "MaxNorm",
                                                                   "config": {"max_value": 3.0}}}),
}

# case: (spec, the rule that must rank in the top 2)
BUGGY = {
    "nan-feature-row": (spec("mlp", "tabular", data_args={"nan_rows": [40]}), "clean-input-data"),
    "missing-value-code-9999": (spec("mlp", "tabular", optimizer={"name": "sgd", "learning_rate": 0.01},
                                     data_args={"glitch_rows": [200, 205]}), "drop-outlier-rows"),
    "log-of-softmax-layer": (spec("log_probabilities", "classes", SPARSE), "stable-log"),
    "exp-overflow-layer": (spec("exp_features", "tabular"), "stable-exp"),
    "share-of-a-zero-total": (spec("share_of_total", "tabular"), "safe-division"),
    "norm-of-zero-activations": (spec("distance", "tabular"), "safe-sqrt"),
    "learning-rate-too-high": (spec("mlp", "tabular", optimizer={"name": "sgd", "learning_rate": 3.0}),
                               "lower-learning-rate"),
    "unscaled-inputs": (spec("mlp", "tabular", optimizer={"name": "sgd", "learning_rate": 0.01},
                             data_args={"x_scale": 5000.0}), "normalize-inputs"),
    "unscaled-targets": (spec("mlp", "tabular", optimizer={"name": "sgd", "learning_rate": 0.01},
                              data_args={"y_scale": 5000.0}), "normalize-targets"),
    # A forward overflow: loss scaling (which multiplies the gradients) cannot stop it; a float32 layer does.
    "float16-overflow-no-loss-scaling": (spec("float16_overflow", "tabular"), "float32-layer"),
    "adam-epsilon-zero-dead-relu": (spec("dead_relu", "tabular", optimizer={"name": "adam", "learning_rate": 0.01,
                                                                           "epsilon": 0.0}), "optimizer-epsilon"),
    "attention-row-fully-masked": (spec("masked_pooling", "padded", data_args={"empty_rows": [5]}), "masked-softmax"),
    "loss-file-mean-over-zero-count": (spec("mlp", "tabular", f"{LOSSES}:large_target_mse"), "safe-division"),
    "tf-where-gradient-trap": (spec("mean_of_positives", "tabular"), "double-where"),
    "gem-pooling-without-clamp": (spec("gem", "tabular"), "safe-pow"),
    "focal-loss-gamma-half": (spec("mlp", "tabular", f"{LOSSES}:focal_gamma_half",
                                   {"name": "adam", "learning_rate": 0.01}, steps=80,
                                   model_args={"activation": "sigmoid"}, data_args={"kind": "binary"}), "safe-pow"),
    "arcface-2d-unclamped": (spec("arcface", "classes", SPARSE), "clamp-inverse-trig"),
    "negative-binomial-relu-dispersion": (spec("linear_head", "counts", f"{LOSSES}:negative_binomial_relu",
                                               model_args={"outputs": 2}), "avoid-poles"),
    "poisson-relu-rate": (spec("linear_head", "counts", f"{LOSSES}:poisson_relu"), "avoid-poles"),
    "rmsle-linear-head": (spec("linear_head", "prices", f"{LOSSES}:rmsle"), "avoid-poles"),
    "attention-pooling-plus-inf-fill": (spec("filled_pooling", "padded"), "finite-logits"),
    "mape-over-zero-counts": (spec("linear_head", "counts", f"{LOSSES}:mape"), "safe-division"),
    "compound-growth-product": (spec("compound_growth", "tabular"), "guard-op"),
    # A 1-D convolutional denoiser whose convolutions compute in float16 without loss scaling, trained on the batch's
    # total squared error: the forward pass and the loss stay finite (loss 4.97e4), but the last convolution's bias
    # gradient sums 2 * (p - y) over 32 x 2048 positions and overflows float16 at step 0.
    "float16-gradient-overflow-no-loss-scaling": (spec("denoiser", "signals", f"{LOSSES}:total_squared_error"),
                                                  "loss-scaling"),
    # The classic exploding-gradient regression (Brownlee): targets with a std near 180, SGD with momentum 0.9; the
    # gradient norm grows geometrically for 5 steps before the loss overflows.
    "sgd-momentum-exploding-regression": (spec("mlp", "tabular", optimizer={"name": "sgd", "learning_rate": 0.01,
                                                                           "momentum": 0.9}, steps=100,
                                               model_args={"features": 20, "units": 25},
                                               data_args={"features": 20, "y_scale": 180.0}), "clip-gradients"),
    # An IRNN (relu SimpleRNN, identity recurrent kernel; Le et al. 2015) on 100-step random walks, its last state
    # layer-normalised: the state grows ~1.75x a step with the weights' norm flat, passes float32's sqrt(max) and
    # the LayerNormalization's output turns constant. It stays finite and learns nothing (see test_corpus).
    "irnn-relu-state-growth": (spec("irnn", "sequences", "mse", {"name": "adam", "learning_rate": 0.01}, steps=64,
                                    data_args={"steps": 100}), "bounded-activation"),
    # A WGAN critic without its weight clipping, on fixed real and generated rows: its loss is linear in the score,
    # so SGD grows the weights without bound (6.96 to 3.9e16 in 126 steps) until a MatMul overflows.
    "wgan-critic-without-weight-clipping": (spec("critic", "critic_samples", f"{LOSSES}:wasserstein",
                                                 {"name": "sgd", "learning_rate": 0.01}, steps=160),
                                            "weight-constraint"),
}

# case: where its printed top fix goes when `fixing.py` applies it: a `train:` YAML block, numpy on the data, a
# layer put first, a wrapper of the optimizer, code inside the case's layer (`model`) or loss function (`loss`) at
# the line the rule names, or a keyword of the layer call it prints (`layer-arg:NAME`: the model factory's argument
# NAME sets it for that layer).
TOP_FIX_SITES = {
    "nan-feature-row": "data", "missing-value-code-9999": "data", "log-of-softmax-layer": "model",
    "exp-overflow-layer": "model", "share-of-a-zero-total": "model", "norm-of-zero-activations": "model",
    "learning-rate-too-high": "train", "unscaled-inputs": "first-layer", "unscaled-targets": "data",
    "float16-overflow-no-loss-scaling": "layer-arg:dtype", "adam-epsilon-zero-dead-relu": "train",
    "attention-row-fully-masked": "model", "loss-file-mean-over-zero-count": "loss", "tf-where-gradient-trap": "model",
    "gem-pooling-without-clamp": "model", "focal-loss-gamma-half": "loss", "arcface-2d-unclamped": "model",
    "negative-binomial-relu-dispersion": "loss", "poisson-relu-rate": "loss", "rmsle-linear-head": "loss",
    "attention-pooling-plus-inf-fill": "model", "mape-over-zero-counts": "loss", "compound-growth-product": "model",
    "sgd-momentum-exploding-regression": "train", "irnn-relu-state-growth": "layer-arg:activation",
    "wgan-critic-without-weight-clipping": "layer-arg:kernel_constraint",
    "float16-gradient-overflow-no-loss-scaling": "optimizer",
}

# Models that override `train_step` (keras-io's VAE and GAN, `generative.py`), watched by the NanScope callback in
# `model.fit`: case: (factory, the images' scale). The healthy ones are the buggy ones with their top fix applied
# (the inputs brought to 0-1).
GENERATIVE = HERE / "generative.py"
FIT_HEALTHY = {"vae-0-1-images": ("vae", 1.0), "gan-0-1-images": ("gan", 1.0)}
# case: ((factory, scale), the rule that must rank first), and the healthy case that is its top fix applied.
FIT_BUGGY = {"vae-raw-inputs-near-1000": (("vae", 1000.0), "normalize-inputs"),
             "gan-raw-pixels-handwritten-bce": (("gan", 255.0), "normalize-inputs")}
FIT_FIXED = {"vae-raw-inputs-near-1000": "vae-0-1-images", "gan-raw-pixels-handwritten-bce": "gan-0-1-images"}

# The check-data part of the corpus: csv tables written by `data_files.churn_csv(path, **args)` and scanned by
# `nanscope check-data TABLE CHECK_DATA_ARGS`. A healthy table must get no finding at warning or error level.
DATA_FILES = HERE / "data_files.py"
CHECK_DATA_ARGS = ("--target", "churned", "--loss", "sparse_categorical_crossentropy", "--classes", "2")
CHECK_DATA_HEALTHY = {"churn-csv": {}, "churn-csv-without-unknown-rows": {"known_rows_only": True}}
# case: (args, the rule that must fire, its severity). drop-constant-features is info: a constant column does not
# break training by itself (Keras' Normalization floors the std), only a hand-written (x - mean) / std does.
CHECK_DATA_BUGGY = {
    "churn-csv-constant-country-and-vat": ({"constant_columns": True}, "drop-constant-features", "info"),
    "churn-csv-unknown-label-minus-1": ({"unknown_labels": True}, "fix-labels", "error"),
}
# case: the healthy table that is its printed fix applied.
CHECK_DATA_FIXED = {"churn-csv-constant-country-and-vat": "churn-csv",
                    "churn-csv-unknown-label-minus-1": "churn-csv-without-unknown-rows"}
