"""The cells of the feature matrix (docs/matrix.md): per cell one tiny model and the Keras features it combines.

A cell builds its model, optimizer, data and fit arguments from a fixed seed, so the same
cell trained twice, once with nanscope and once without, must give the same losses and
weights. Used in-process by tests/test_matrix_fit.py and tests/test_matrix_guests.py, and
as a script (`python tests/matrix_cells.py CELL OUT [mirrored|multi_worker]`) for the ways
to train that need their own process (two logical CPUs, two workers).
"""

import contextlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

if __name__ == "__main__" and sys.argv[3:4] == ["multi_worker"]:
    import tensorflow as _tf  # the strategy must be made before TensorFlow starts its devices, as a user's script does

    STRATEGY = _tf.distribute.MultiWorkerMirroredStrategy()

from nanscope.runtime import tensorflow  # configures NANSCOPE_CPU_REPLICAS before TF starts

tf, keras = tensorflow()

ROWS, BATCH, EPOCHS, FEATURES, TIMESTEPS, VOCAB, CLASSES = 64, 16, 2, 6, 5, 20, 3
STEPS = EPOCHS * ROWS // BATCH


class HalvingSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A user's own schedule: the rate halves every `every` steps."""

    def __init__(self, rate=0.02, every=3):
        self.rate, self.every = rate, every

    def __call__(self, step):
        return self.rate * 0.5 ** keras.ops.cast(step // self.every, "float32")

    def get_config(self):
        return {"rate": self.rate, "every": self.every}


class Gain(keras.layers.Layer):
    """A user's own layer with its own weight, built in `build`."""

    def build(self, input_shape):
        self.gain = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="gain")

    def call(self, x):
        return x * self.gain


@dataclass
class Cell:
    """One cell: what to build and how to fit it.

    Args:
        name: str. The cell's id in the tests and docs/matrix.md.
        model: callable() -> keras.Model (uncompiled).
        optimizer: callable() -> keras optimizer.
        data: str. "regression" (x (ROWS, FEATURES), y (ROWS, 1)), "sequence" (float (ROWS, TIMESTEPS,
            FEATURES)), "tokens" (int (ROWS, TIMESTEPS)) or "classes" (x regression-like, y int labels).
        loss: str, default "mse".
        policy: str, optional. A Keras dtype policy for the model (mixed_float16, mixed_bfloat16).
        fit: callable(x, y) -> dict, optional. fit's extra arguments (sample_weight, class_weight, validation_data).
        callbacks: callable(folder) -> list, optional. The user's other callbacks, writing under `folder`.
        jit_compile: bool, default False.
        optimizer_class: str. The optimizer class the report must name.
        spec_optimizer: dict, optional. `train.optimizer` of a run spec that builds the same optimizer
            (None: the cell's features cannot be written in a spec, e.g. sample weights).
    """

    name: str
    model: object
    optimizer: object
    optimizer_class: str
    data: str = "regression"
    loss: str = "mse"
    policy: str | None = None
    fit: object = None
    callbacks: object = None
    jit_compile: bool = False
    spec_optimizer: dict | None = None


def dense_model(*middle):
    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="relu"), *middle,
                             keras.layers.Dense(1)])


def sequence_model(recurrent):
    return keras.Sequential([keras.Input((TIMESTEPS, FEATURES)), recurrent, keras.layers.Dense(1)])


def token_model():
    """Embedding -> GRU -> softmax over CLASSES."""
    return keras.Sequential([keras.Input((TIMESTEPS,), dtype="int32"), keras.layers.Embedding(VOCAB, 4),
                             keras.layers.GRU(4), keras.layers.Dense(CLASSES, activation="softmax")])


def attention_model():
    """LSTM -> self-attention -> a user's layer -> pooled regression head."""
    inputs = keras.Input((TIMESTEPS, FEATURES))
    hidden = keras.layers.LSTM(4, return_sequences=True)(inputs)
    attended = keras.layers.MultiHeadAttention(num_heads=2, key_dim=2)(hidden, hidden)
    pooled = keras.layers.GlobalAveragePooling1D()(Gain()(attended))
    return keras.Model(inputs, keras.layers.Dense(1)(pooled))


def sample_weights(x, y):
    return {"sample_weight": np.linspace(0.5, 1.5, len(x)).astype("float32")}


def class_weights(x, y):
    return {"class_weight": {0: 1.0, 1: 2.0, 2: 0.5}}


def validation(x, y):
    return {"validation_data": (x[: ROWS // 2] * 0.9, y[: ROWS // 2])}


def other_callbacks(folder):
    """ModelCheckpoint, ReduceLROnPlateau (which halves the rate after every epoch here), EarlyStopping,
    BackupAndRestore and TensorBoard (where the tensorboard package is installed: Keras' callback needs it)."""
    folder = Path(folder)
    board = [keras.callbacks.TensorBoard(str(folder / "tensorboard"))] if has_tensorboard() else []
    return [keras.callbacks.ModelCheckpoint(str(folder / "checkpoint.keras")),
            keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=10.0),
            keras.callbacks.EarlyStopping(monitor="loss", patience=10),
            keras.callbacks.BackupAndRestore(str(folder / "backup")), *board]


def has_tensorboard():
    import importlib.util

    return importlib.util.find_spec("tensorboard") is not None


ADAM = {"name": "adam", "learning_rate": 0.01}
CELLS = {cell.name: cell for cell in [
    Cell("exponential-decay+adamw", lambda: dense_model(),
         lambda: keras.optimizers.AdamW(keras.optimizers.schedules.ExponentialDecay(0.01, 4, 0.5), weight_decay=0.05),
         "AdamW", spec_optimizer={"name": "adamw", "weight_decay": 0.05, "learning_rate": {
             "class_name": "ExponentialDecay", "config": {"initial_learning_rate": 0.01, "decay_steps": 4,
                                                          "decay_rate": 0.5}}}),
    Cell("cosine-warmup+ema+global-clipnorm", lambda: dense_model(),
         lambda: keras.optimizers.Adam(keras.optimizers.schedules.CosineDecay(0.0, 8, warmup_target=0.02,
                                                                              warmup_steps=3),
                                       use_ema=True, global_clipnorm=1.0), "Adam",
         spec_optimizer={"name": "adam", "use_ema": True, "global_clipnorm": 1.0, "learning_rate": {
             "class_name": "CosineDecay", "config": {"initial_learning_rate": 0.0, "decay_steps": 8,
                                                     "warmup_target": 0.02, "warmup_steps": 3}}}),
    Cell("custom-schedule+accumulation", lambda: dense_model(),
         lambda: keras.optimizers.SGD(HalvingSchedule(), momentum=0.9, gradient_accumulation_steps=2), "SGD",
         spec_optimizer={"name": "sgd", "momentum": 0.9, "gradient_accumulation_steps": 2, "learning_rate": {
             "class_name": f"{__file__}:HalvingSchedule", "config": {}}}),
    Cell("float16+loss-scaling+batchnorm", lambda: dense_model(keras.layers.BatchNormalization()),
         lambda: keras.optimizers.Adam(0.01), "Adam", policy="mixed_float16", spec_optimizer=ADAM),
    Cell("bfloat16+dropout", lambda: dense_model(keras.layers.Dropout(0.3)),
         lambda: keras.optimizers.Adam(0.01), "Adam", policy="mixed_bfloat16", spec_optimizer=ADAM),
    Cell("sample-weight+validation", lambda: dense_model(), lambda: keras.optimizers.SGD(0.01), "SGD",
         fit=lambda x, y: {**sample_weights(x, y), **validation(x, y)}),
    Cell("class-weight+embedding+gru", token_model, lambda: keras.optimizers.RMSprop(0.001), "RMSprop",
         data="tokens", loss="sparse_categorical_crossentropy", fit=class_weights),
    Cell("embedding+gru", token_model, lambda: keras.optimizers.RMSprop(0.001), "RMSprop",
         data="tokens", loss="sparse_categorical_crossentropy", spec_optimizer={"name": "rmsprop",
                                                                                "learning_rate": 0.001}),
    Cell("lstm+attention+custom-layer", attention_model, lambda: keras.optimizers.Adam(0.002), "Adam",
         data="sequence", spec_optimizer={"name": "adam", "learning_rate": 0.002}),
    Cell("other-callbacks", lambda: dense_model(), lambda: keras.optimizers.SGD(0.01), "SGD",
         callbacks=other_callbacks),
    Cell("jit-compile+batchnorm+dropout",
         lambda: dense_model(keras.layers.BatchNormalization(), keras.layers.Dropout(0.2)),
         lambda: keras.optimizers.Adam(0.01), "Adam", jit_compile=True, spec_optimizer=ADAM),
]}


def spec_model(cell):
    """A run spec's model factory: the cell's model."""
    return CELLS[cell].model()


def spec_data(cell):
    """A run spec's data factory: the cell's data."""
    return cell_data(CELLS[cell])


def run_spec(name, steps=STEPS, **train):
    """A run spec (a dict) that trains cell `name` as trace-steps: no shuffling, seed 0."""
    cell = CELLS[name]
    return {"model": {"factory": f"{__file__}:spec_model", "args": {"cell": name}},
            "data": {"factory": f"{__file__}:spec_data", "args": {"cell": name}, "batch_size": BATCH,
                     "shuffle": False},
            "train": {"loss": cell.loss, "optimizer": cell.spec_optimizer, "steps": steps, "seed": 0,
                      "jit_compile": cell.jit_compile, "mixed_precision": cell.policy, **train}}


def plain_steps(cell, steps=STEPS, rows=ROWS):
    """The step losses of the cell trained in plain Keras on the first `rows` rows in order (train_on_batch), from
    seed 0 as trace-steps seeds it."""
    keras.utils.set_random_seed(0)
    x, y = cell_data(cell)
    keras.utils.set_random_seed(0)
    with dtype_policy(cell.policy):
        model = cell.model()
        model.compile(optimizer=cell.optimizer(), loss=cell.loss, jit_compile=cell.jit_compile)
    losses, per_epoch = [], rows // BATCH
    for step in range(steps):
        part = slice((step % per_epoch) * BATCH, (step % per_epoch + 1) * BATCH)
        losses.append(float(model.train_on_batch(x[part], y[part], return_dict=True)["loss"]))
    return losses


def cell_data(cell):
    """(x, y) of a cell, the same on every call."""
    rng = np.random.default_rng(0)
    if cell.data == "tokens":
        x = rng.integers(0, VOCAB, (ROWS, TIMESTEPS)).astype("int32")
        return x, (x.sum(axis=1) % CLASSES).astype("int32")
    shape = (ROWS, TIMESTEPS, FEATURES) if cell.data == "sequence" else (ROWS, FEATURES)
    x = rng.standard_normal(shape).astype("float32")
    flat = x.reshape(ROWS, -1)
    return x, (flat[:, :3].sum(axis=1, keepdims=True) * 0.5).astype("float32")


class BatchLosses(keras.callbacks.Callback):
    """fit's own logs after each execution: the epoch's running mean loss."""

    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_batch_end(self, batch, logs=None):
        self.losses.append(float(logs["loss"]))


@contextlib.contextmanager
def dtype_policy(name):
    before = keras.config.dtype_policy().name
    keras.config.set_dtype_policy(name or "float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(before)


def fit_cell(cell, folder, scope=None, steps_per_execution=1, strategy=None):
    """Fit `cell` from seed 0 (with the NanScope callback `scope` first when given); (history, logged losses,
    final weights)."""
    Path(folder).mkdir(parents=True, exist_ok=True)
    keras.utils.set_random_seed(0)
    x, y = cell_data(cell)
    with dtype_policy(cell.policy), (strategy.scope() if strategy is not None else contextlib.nullcontext()):
        model = cell.model()
        model.compile(optimizer=cell.optimizer(), loss=cell.loss, steps_per_execution=steps_per_execution,
                      jit_compile=cell.jit_compile)
    seen = BatchLosses()
    callbacks = [*([scope] if scope is not None else []), seen, *(cell.callbacks(folder) if cell.callbacks else [])]
    extra = cell.fit(x, y) if cell.fit else {}
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        keras_20585_workarounds(model, strategy)
        # Every worker reads every row (auto-sharding off) and the strategy splits each global batch.
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH).with_options(options)
        history = model.fit(dataset, epochs=EPOCHS, verbose=0, callbacks=callbacks, **extra)
    else:
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=callbacks,
                            **extra)
    return history.history, seen.losses, [np.asarray(w) for w in model.get_weights()], model


def keras_20585_workarounds(model, strategy):
    """What a user's script does for Keras 3's fit under MultiWorkerMirroredStrategy (keras#20585, as
    tests/specs/multi_worker/fit_callback.py): build from this worker's first replica's batch, and reduce the
    per-step logs over this worker's replicas."""
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    original = model._maybe_symbolic_build

    def build_from_local_batch(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], next(batches))
                break
        return original(data_batch=data_batch)

    model._maybe_symbolic_build = build_from_local_batch
    keras_tf_trainer._collective_all_reduce_multi_worker = lambda strategy: False


def _main(name, out, how):
    """Fit a cell with and without NanScope under `how` (mirrored, multi_worker); write what the test compares."""
    from nanscope.keras import NanScope
    from rich.console import Console

    out = Path(out)
    cell = CELLS[name]
    strategy = tf.distribute.MirroredStrategy() if how == "mirrored" else STRATEGY
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
    folder = out / f"w{task}"
    with open(folder.with_suffix(".txt"), "w") as shown:
        scope = NanScope(report=folder / "report.json", console=Console(file=shown, width=80))
        with_scope, logged, weights, _ = fit_cell(cell, folder / "with", scope, strategy=strategy)
    without, plain_logged, plain_weights, _ = fit_cell(cell, folder / "without", strategy=strategy)
    print(json.dumps({"task": task, "history": with_scope, "plain_history": without, "logged": logged,
                      "plain_logged": plain_logged,
                      "weights_equal": all(np.allclose(a, b, rtol=1e-5, atol=1e-7)
                                           for a, b in zip(weights, plain_weights, strict=True))}))


if __name__ == "__main__":
    _main(*sys.argv[1:4])
