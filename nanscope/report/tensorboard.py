"""Per-step records as TensorBoard scalars, so a trace opens in TensorBoard.

`TensorBoardLog` writes one event per quantity per step with `tf.summary`:
the run's scalars (`loss`, `grad_global_norm`, non-finite counts per phase), and per
layer `layers/<name>/max_abs`, `mean_abs` and `nonfinite`, per variable
`variables/<name>/grad_norm` and `update_ratio`, and per output of a multi-output model
`outputs/<name>/loss`, `target_nonfinite` and `prediction_nonfinite`. The step function returns
reductions only, so there are no per-element histograms: per-layer scalars instead.

Events are written with TensorFlow's own `tf.summary.write` and the scalar plugin's
metadata (what `tf.summary.scalar` writes), so the `tensorboard` package is needed
only to view them, not to write them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from nanscope.engine.records import StepRecord
from nanscope.runtime import tensorflow

STEP_SCALARS = {
    "loss": "loss",
    "data_loss": "data_loss",
    "grad_global_norm": "grad_global_norm",
    "applied_grad_global_norm": "applied_grad_global_norm",
    "nonfinite/x": "x_nonfinite",
    "nonfinite/y": "y_nonfinite",
    "nonfinite/output": "output_nonfinite",
    "nonfinite/grad": "grad_nonfinite",
    "nonfinite/weights": "weights_nonfinite",
}
LAYER_SCALARS = ("max_abs", "mean_abs", "nonfinite")
VARIABLE_SCALARS = ("grad_norm", "update_ratio")
OUTPUT_SCALARS = ("loss", "target_nonfinite", "prediction_nonfinite")


class TensorBoardLog:
    """Writes StepRecords to a TensorBoard log folder.

    Args:
        logdir: str or Path. Created if missing; event files are added to it.
        layers: list of (name, class) pairs, in the records' layer order.
        variables: list of str. Variable names, in the records' variable order.
        outputs: list of str, default (). A multi-output model's output names, in the records' output order.

    Example:
        with TensorBoardLog("runs/tb", report.layers, report.variables) as board:
            for record in report.records:
                board.write(record)
    """

    def __init__(self, logdir: str | os.PathLike[str], layers: Iterable[tuple[str, str]], variables: Iterable[str],
                 outputs: Sequence[str] = ()) -> None:
        tf, _ = tensorflow()
        self.layer_names = [name for name, _ in layers]
        self.variable_names = list(variables)
        self.output_names = list(outputs)
        self._writer = tf.summary.create_file_writer(str(logdir))
        self._metadata = tf.compat.v1.SummaryMetadata(
            plugin_data=tf.compat.v1.SummaryMetadata.PluginData(plugin_name="scalars")
        ).SerializeToString()

    def write(self, record: StepRecord) -> None:
        """Write one step's scalars."""
        with self._writer.as_default(step=record.step):
            for tag, attribute in STEP_SCALARS.items():
                if not (record.loss_missing and attribute in ("loss", "data_loss")):  # unknown: nothing to draw
                    self._scalar(tag, getattr(record, attribute))
            for name, stats in zip(self.layer_names, record.layers):
                if stats.called:
                    for quantity in LAYER_SCALARS:
                        self._scalar(f"layers/{name}/{quantity}", getattr(stats, quantity))
            for name, stats in zip(self.variable_names, record.variables):
                for quantity in VARIABLE_SCALARS:
                    self._scalar(f"variables/{name}/{quantity}", getattr(stats, quantity))
            for name, stats in zip(self.output_names, record.outputs):
                for quantity in OUTPUT_SCALARS:
                    self._scalar(f"outputs/{name}/{quantity}", getattr(stats, quantity))

    def _scalar(self, tag: str, value: float) -> None:
        tf, _ = tensorflow()
        # NaN and Inf are written as they are; TensorBoard shows them as such.
        tf.summary.write(tag, tf.constant(float(value), tf.float32), metadata=self._metadata)

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.flush()
        self._writer.close()

    def __enter__(self) -> TensorBoardLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

