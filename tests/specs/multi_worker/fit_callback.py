"""model.fit under MultiWorkerMirroredStrategy with the NanScope callback, on one worker of a 2-worker cluster.

Run once per worker with its own TF_CONFIG. Each worker is given its own output paths (OUT/w<task>/...),
so the test sees which workers wrote: only the chief may. Each worker feeds its own rows (auto-sharding off):
worker 1's hold a NaN in the second step's part (not with `--healthy`). Prints what the test checks as JSON,
with the calls of `tf.distribute.ReplicaContext.all_reduce` and `all_gather` made while the fit traced its step
(with `--bare`, the same fit without the callback: Keras' own) and the loss fit logs after each step.
"""

import collections
import dataclasses
import functools
import json
import sys

import keras
import numpy as np
import tensorflow as tf
from rich.console import Console

# The strategy first, as the user's script does: it must be made before TensorFlow starts its devices.
strategy = tf.distribute.MultiWorkerMirroredStrategy()
task = strategy.cluster_resolver.task_id

from keras.src.backend.tensorflow import trainer as keras_tf_trainer  # noqa: E402

from nanscope.keras import NanScope  # noqa: E402

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")


def build_from_local_batch(iterator=None, data_batch=None, original=model._maybe_symbolic_build):
    """keras#20585: Keras 3's fit reduces its first batch as one nested value, which MultiWorkerMirroredStrategy
    refuses ("Attempt to convert a value (PerReplica...)"); build from this worker's first replica's batch instead."""
    if iterator is not None:
        for _, _, batches in iterator:
            data_batch = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], next(batches))
            break
    return original(data_batch=data_batch)


collectives = collections.Counter()


def counted(name):
    method = getattr(tf.distribute.ReplicaContext, name)

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        collectives[name] += 1
        return method(self, *args, **kwargs)

    return call


for name in ("all_reduce", "all_gather"):
    setattr(tf.distribute.ReplicaContext, name, counted(name))
model._maybe_symbolic_build = build_from_local_batch
# keras#20585 again: fit's per-step logs (scalars) go through strategy.reduce(..., axis=0), which fails for 0-d
# values under MultiWorkerMirroredStrategy; reduce them over this worker's replicas, as under MirroredStrategy.
keras_tf_trainer._collective_all_reduce_multi_worker = lambda strategy: False
rng = np.random.default_rng(task)
x = rng.standard_normal((32, 4)).astype("float32")
y = x.sum(axis=1, keepdims=True).astype("float32")
if task == 1 and "--healthy" not in sys.argv:
    x[8 + 5, 1] = np.nan  # this worker's second step (8 rows a step: a global batch of 16 over 2 workers)
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
out = f"{sys.argv[1]}/w{task}"
scope = NanScope(report=f"{out}/fit.json", trace=f"{out}/fit.jsonl", tensorboard=f"{out}/tb",
                 console=Console(quiet=True))
losses = []
logged = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"])))
model.fit(data, epochs=2, callbacks=[scope, logged] if "--bare" not in sys.argv else [logged], verbose=0)
if "--bare" in sys.argv:
    print(json.dumps({"task": task, "collectives": dict(collectives), "losses": losses}))
    sys.exit(0)
report = scope.report
print(json.dumps({
    "task": task,
    "steps": [r.step for r in report.records],
    "worker_nonfinite": [r.worker_nonfinite for r in report.records],
    "first": {"step": report.first_nonfinite.step, "worker": report.first_nonfinite.worker}
    if report.first_nonfinite else None,
    "collectives": dict(collectives),
    "losses": losses,
    "records": [dataclasses.asdict(r) for r in report.records],
}))
