"""A run's steps in bounded memory: every step's scalars, the full rows of a bounded set of steps, exact aggregates.

Training runs last 10^5 to 10^7 steps, so what nanscope keeps must not hold every
step's full row (every layer and every variable). `StepHistory` keeps:

- every step's scalars (`SERIES`: the step's SCALARS and per-output columns, its
  phase, its global weight norm and update ratio) in preallocated float32 blocks,
  a few dozen bytes a step and no Python object per step;
- the full `StepRecord` of the first `keep` steps, of the last `keep` (a ring), of an
  even sample of at most `sample` steps in between (its stride doubles whenever it
  fills) and of the `keep` steps before and after each event: the first non-finite
  step, the first skipped update, and the onsets of the two warnings that can start
  mid-run (the first loss spike, and the first layer output past its dtype's
  activation bound, engine.limits: ~1.8e19 for float32, 655 for float16);
- per layer, variable and output, running aggregates (largest, smallest, last, number
  of non-finite steps, first and last non-finite step), exact over the whole run
  (`nanscope.store.aggregates`).

Tables and rules read the aggregates and the scalar columns; the kept rows are the
evidence shown step by step. A run shorter than `2 * keep` steps keeps every row.

Example:
    history = StepHistory(layers=3, variables=4, outputs=0)
    for record in records:
        history.add(record)
    history.column("loss"), history.kept(), history.layers[0].max_abs
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
import math

import numpy as np

from nanscope.engine.limits import SPIKE_FACTOR, SPIKE_WINDOW, activation_limit
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import Columns
from nanscope.store.healthy import Healthy
from nanscope.store.aggregates import LayerAggregate, OutputAggregate, VariableAggregate
from nanscope.store.rows import scalar_row, series_columns
from nanscope.store.overview import OVERVIEW_WIDTH, Overview
from nanscope.store.series import ScalarColumns, TraceColumns
from nanscope.spec.options import DEFAULT_KEEP, DEFAULT_SAMPLE

# Events beyond this many add no rows (each costs up to 2 * keep rows; keep: DEFAULT_KEEP).
MAX_EVENTS = 8
# Healthy steps whose per-layer max |x| is kept for the rules' trend fits (rules.bounded_activation). A
# least-squares slope over n points whose log values span D is at most 1.5 * D / n; log
# float32 magnitudes span D = ln(3.4e38 / 1.4e-45) = 191, so a fitted growth of 1.5x a
# step (slope ln 1.5) spans at most 708 points: a fit reaching back further never
# qualifies, and this window gives the fits over every step exactly.
TREND_WINDOW = 1024
# The warning onsets that are events (engine.limits). A loss spike is rules.outliers' (the loss SPIKE_FACTOR
# times the median of the SPIKE_WINDOW finite losses before it); a layer's activation bound is
# rules.bounded_activation's for its dtype (an output whose square overflows float32, a hundredth of float16's
# max).


class StepHistory:
    """Every step's scalars, a bounded set of full rows and exact per-layer/variable/output aggregates.

    Args:
        layers: int. Probed layers (the records' `layers` length).
        variables: int. Trainable variables.
        outputs: int. Outputs of a multi-output model (0 for one output).
        keep: int, default DEFAULT_KEEP. Full rows kept at the start, at the end and around each event.
        sample: int, default DEFAULT_SAMPLE. Full rows kept of an even sample of the steps in between.
        series: callable(Columns) -> ScalarColumns or TraceColumns, default ScalarColumns. Where every
            step's scalars live (nanscope/store/series.py): in memory, or in the trace a report is redrawn from.
        layer_dtypes: list of str, optional. Each probed layer's compute dtype, in record order (None or a
            shorter list: float32), for the activation bound whose first crossing is an event.
    """

    _head: list[StepRecord]
    _ring: collections.deque[StepRecord]
    _sample: dict[int, StepRecord]
    _events: dict[int, StepRecord]
    _persisted: dict[int, str]
    _recent_losses: collections.deque[float]
    _overview: tuple[tuple[int, int], Overview] | None
    first_nonfinite_step: int | None
    first_skipped_step: int | None
    first_spike_step: int | None
    first_bound_step: int | None

    def __init__(self, layers: int, variables: int, outputs: int = 0, keep: int = DEFAULT_KEEP,
                 sample: int = DEFAULT_SAMPLE, series: Callable[[Columns], ScalarColumns | TraceColumns] | None = None,
                 layer_dtypes: Sequence[str | None] | None = None) -> None:
        if keep < 1 or sample < 2:
            raise ValueError(f"`keep` must be >= 1 and `sample` >= 2. Received: keep={keep}, sample={sample}")
        self.keep, self.sample_size = keep, sample
        self.series = (series or ScalarColumns)(series_columns(outputs))
        self._overview = None
        self.layers = [LayerAggregate() for _ in range(layers)]
        self.variables = [VariableAggregate() for _ in range(variables)]
        self.outputs = [OutputAggregate() for _ in range(outputs)]
        self._head, self._ring = [], collections.deque(maxlen=keep)
        self._sample, self._stride = {}, 1
        self._events, self._event_until = {}, -1
        # Steps whose rows `keep_row` handed out (written to the trace already), each with why it kept them.
        self._persisted = {}
        self._trend_steps = np.full(TREND_WINDOW, -1, np.int64)
        self._trend = np.full((TREND_WINDOW, layers), np.nan, np.float32)
        self._trend_count = 0
        self.first_nonfinite_step = self.first_skipped_step = None
        self.first_spike_step = self.first_bound_step = None
        dtypes = list(layer_dtypes or [])
        self._bounds = [activation_limit(dtypes[i] if i < len(dtypes) else None) for i in range(layers)]
        self._recent_losses = collections.deque(maxlen=SPIKE_WINDOW)

    @property
    def count(self) -> int:
        """Steps recorded."""
        return self.series.count

    def add(self, record: StepRecord) -> list[StepRecord]:
        """Record one step: its scalars, its aggregates, and its full row where it is kept.

        Returns:
            list of StepRecord: the full rows that became kept for good now (the first steps,
            sampled steps, the steps around an event), to write to the trace; the last
            steps' rows are known only at the end (`unwritten`).
        """
        self.series.append(record.step, scalar_row(record))
        self.aggregate(record)
        return self.keep_row(record)

    def aggregate(self, record: StepRecord) -> None:
        """Fold one record into the per-layer, per-variable and per-output aggregates."""
        healthy, step = record.phase is None, record.step
        for aggregate, stats in zip(self.layers, record.layers):
            aggregate.add(step, stats, healthy)
        if healthy and self.layers and record.layers:  # a sentinel step has no layer rows
            at = self._trend_count % TREND_WINDOW
            self._trend_steps[at] = step
            self._trend[at] = [s.max_abs if s.called else np.nan for s in record.layers[:len(self.layers)]]
            self._trend_count += 1
        # A skipped update whose scaled gradients overflowed is loss scaling at work, not a non-finite step.
        absorbed = healthy and record.update_skipped
        for variable, stats in zip(self.variables, record.variables):
            variable.add(step, stats, absorbed)
        for output, stats in zip(self.outputs, record.outputs):
            output.add(step, stats)

    def keep_row(self, record: StepRecord) -> list[StepRecord]:
        """Keep `record`'s full row where the policy says so; return the rows that became kept for good."""
        fresh, why = [], None
        if self._is_event(record):
            fresh = [r for r in self._ring if r.step not in self._persisted]
            self._events.update((r.step, r) for r in fresh)
            self._persisted.update((r.step, "event") for r in fresh)
            self._event_until = record.step + self.keep
        if len(self._head) < self.keep:
            self._head.append(record)
            why = "head"
        elif record.step <= self._event_until:
            self._events[record.step] = record
            why = "event"
        elif self._sampled(record):
            why = "sample"
        if why is not None:
            fresh.append(record)
            self._persisted[record.step] = why
        self._ring.append(record)
        return fresh

    def why_kept(self, step: int) -> str:
        """Why the row of `step` is kept: "head", "event" or "sample" for a row `add` handed out, else "last"."""
        return self._persisted.get(step, "last")

    def keep_read_row(self, record: StepRecord, why: str | None) -> None:
        """Keep a full row read back from a trace, by why the run kept it (`why_kept`), as the run did.

        The run wrote every row that entered its sample, and the trace's last `keep` rows are
        its ring; a row that made the sample's stride double without entering it was not
        written, so `thin_sample` then takes the run's last stride (the aggregates line's).
        """
        if why == "head":
            self._head.append(record)
        elif why == "event":
            self._events[record.step] = record
        elif why == "sample":
            self._sampled(record)
        self._ring.append(record)

    @property
    def sample_stride(self) -> int:
        """Every how many steps the even sample keeps a row now."""
        return self._stride

    def thin_sample(self, stride: object) -> None:
        """Take `stride` (a power of two, at least the sample's) as the sample's, and drop the rows it leaves out."""
        if isinstance(stride, int) and stride > self._stride:
            self._stride = stride
            self._sample = {step: r for step, r in self._sample.items() if step % stride == 0}

    def _sampled(self, record: StepRecord) -> bool:
        if record.step % self._stride:
            return False
        self._sample[record.step] = record
        if len(self._sample) > self.sample_size:
            self._stride *= 2
            self._sample = {step: r for step, r in self._sample.items() if step % self._stride == 0}
        return record.step in self._sample

    def _is_event(self, record: StepRecord) -> bool:
        """True for the first non-finite step, the first skipped update, the first loss spike and the first
        layer output past the activation bound."""
        event = False
        if record.phase is not None and self.first_nonfinite_step is None:
            self.first_nonfinite_step, event = record.step, True
        if record.update_skipped and self.first_skipped_step is None:
            self.first_skipped_step, event = record.step, True
        if self.first_spike_step is None and self._spiked(record.loss):
            self.first_spike_step, event = record.step, True
        if len(record.layers) > len(self._bounds):  # layers the history was not told of: float32's bound
            self._bounds += [activation_limit(None)] * (len(record.layers) - len(self._bounds))
        if self.first_bound_step is None and any(
                s.called and s.max_abs > bound for s, bound in zip(record.layers, self._bounds)):
            self.first_bound_step, event = record.step, True
        return event

    def _spiked(self, loss: float) -> bool:
        before = self._recent_losses
        if not math.isfinite(loss):
            return False
        spiked = False
        # The median is at least the minimum, so most steps are decided without it.
        if before and loss > SPIKE_FACTOR * min(before):
            median = float(np.median(np.fromiter(before, np.float64)))
            spiked = median > 0 and loss > SPIKE_FACTOR * median
        before.append(loss)
        return spiked

    def unwritten(self) -> list[StepRecord]:
        """Kept rows not yet handed out by `add`: the ring's, in step order."""
        return [r for r in self._ring if r.step not in self._persisted]

    def layer_trend(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """(steps, max |x|) of layer `index` over the last TREND_WINDOW healthy steps it was called on, in order."""
        filled = min(self._trend_count, TREND_WINDOW)
        order = np.argsort(self._trend_steps[:filled], kind="stable")
        steps, values = self._trend_steps[:filled][order], self._trend[:filled, index][order].astype(np.float64)
        called = ~np.isnan(values)
        return steps[called], values[called]

    def kept(self) -> list[StepRecord]:
        """Every kept full row, in step order, each once."""
        by_step = {r.step: r for r in self._head}
        by_step.update(self._sample)
        by_step.update(self._events)
        by_step.update((r.step, r) for r in self._ring)
        return [by_step[step] for step in sorted(by_step)]

    def record_at(self, step: int) -> StepRecord | None:
        """The kept full row of `step`, or None."""
        found = next((r for r in self._ring if r.step == step), None)
        return found or self._events.get(step) or self._sample.get(step) or next(
            (r for r in self._head if r.step == step), None)

    def steps(self) -> np.ndarray:
        """Every step's number, int64."""
        return self.series.steps()

    def column(self, name: str) -> np.ndarray:
        """Every step's value of SERIES column `name` (a SCALARS name, "phase", "weight_norm", ...), float64."""
        return self.series.column(name)

    def overview(self, width: int = OVERVIEW_WIDTH) -> Overview:
        """What a report shows of every step's scalars (store.overview.Overview), in bounded size; cached until a
        new step."""
        if self._overview is None or self._overview[0] != (self.count, width):
            self._overview = ((self.count, width), self.series.overview(width))
        return self._overview[1]

    def phases(self) -> np.ndarray:
        """Every step's phase code (an index into PHASES; 0 is a finite step)."""
        return self.column("phase").astype(np.int64)

    def healthy(self) -> Healthy:
        """The finite steps: their scalars, and their kept full rows."""
        mask = self.phases() == 0
        pick = {name: self.column(name)[mask] for name in ("loss", "grad_global_norm", "update_ratio", "weight_norm")}
        return Healthy(self.steps()[mask], pick["loss"], pick["grad_global_norm"], pick["update_ratio"],
                       pick["weight_norm"], [r for r in self.kept() if r.phase is None])

    def sampling_note(self) -> str:
        """How the kept steps were chosen, for the report."""
        kept = len(self.kept())
        if kept == self.count:
            return f"all {self.count} steps are kept"
        return (f"{kept} of {self.count} steps are kept with every layer and variable: the first {self.keep}, "
                f"the last {self.keep}, every {self._stride}th step in between and the {self.keep} steps before and "
                "after the first non-finite step, the first skipped update, the first loss spike and the first layer "
                "output past its dtype's activation bound; every step's scalars are kept, and "
                "the layer, variable and output tables are exact over all steps")
