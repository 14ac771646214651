"""The run header of every report and trace (`report.run`): its fields, in the one order they are written.

trace-steps (`run/describe.py`), the `NanScope` callback (`keras/header.py`, `keras/fitrun.py`) and
`instrument` (`keras/guest_run.py`) each build theirs with `run_header`, which refuses a field it does not
know and one that every header must have left out.
"""


# The run header's fields in the order every report and trace writes them. The first ones are
# in every header (None where a run cannot know them, e.g. the rows of data given to `fit`).
# `compiled` is a custom loop's: whether the step `instrument` wraps is a tf.function.
# `learning_rate_schedule` is there only under a LearningRateSchedule (nanscope/model/learning_rate.py):
# `optimizer_config.learning_rate` is then the rate in effect at its `step`. `learning_rate_changed` is there
# only when a constant rate was assigned during a guest's run (ReduceLROnPlateau): the rate then is the one at
# its `step`.
RUN_FIELDS = (
    "spec", "model", "model_kind", "parameters", "data", "train_rows", "validation_rows", "input_shape",
    "batch_size", "shuffle", "loss", "outputs", "optimizer", "optimizer_config", "learning_rate_schedule",
    "learning_rate_changed",
    "steps_requested", "seed", "jit_compile", "compiled", "steps_per_execution", "mixed_precision", "loss_scaling",
    "layer_dtypes", "distribute",
)
REQUIRED_RUN_FIELDS = ("spec", "model", "model_kind", "parameters", "data", "train_rows", "validation_rows",
                       "batch_size", "shuffle", "loss", "optimizer", "optimizer_config", "steps_requested", "seed",
                       "jit_compile")


def run_header(**fields: object) -> dict:
    """The run header of a report (trace-steps, the NanScope callback): what was run, in the one field order.

    Raises:
        TypeError: a field that is not in RUN_FIELDS, or a required one left out.
    """
    unknown = sorted(set(fields) - set(RUN_FIELDS))
    missing = [name for name in REQUIRED_RUN_FIELDS if name not in fields]
    if unknown or missing:
        raise TypeError(f"run_header: unknown fields {unknown}, missing fields {missing}")
    return {name: fields[name] for name in RUN_FIELDS if name in fields}
