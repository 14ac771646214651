"""SavedModels whose producing op sits inside a restored function, for specs that need one on disk.

A YAML spec cannot build a SavedModel, so a test (or a corpus runner) calls `export`
first and points `model.path` at the folder:

    export(tmp_path / "saved", "ratio_model")   # forward: RealDiv inside __forward_restored_function_body_*
    export(tmp_path / "saved", "root_model")    # backward: SqrtGrad inside __backward_restored_function_body_*
    data: {factory: tests/specs/models.py:wide_data, batch_size: 16, shuffle: false}
"""

import inspect

import keras
import models


def export(path, factory="ratio_model", seed=0):
    """Export `models.<factory>()` (seeded) as a TF SavedModel at `path`; return the Keras model."""
    keras.utils.set_random_seed(seed)
    model = getattr(models, factory)()
    # Keras before 3.4 has no `verbose` here (the oldest-versions smoke run, .ci/run).
    quiet = {"verbose": False} if "verbose" in inspect.signature(model.export).parameters else {}
    model.export(str(path), format="tf_saved_model", **quiet)
    return model
