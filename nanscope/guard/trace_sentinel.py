"""`trace-steps --mode sentinel`: per step only what detection needs; the full step sampled and around events.

trace-steps' sentinel runs nanscope's own step in two compiled variants
(`engine/step.py`): the full one, with the layer probes and the per-variable rows, on
every `sample_every`-th step (the first included) and the `AROUND` steps after an event,
and the light one (`InstrumentedStep.run_light`: the scalars only) on the others. Both
copy the weights and the optimizer's state before the update, so the first non-finite
light step is re-run in full from that copy (`rerun_in_full`) before it is attributed
and replayed op by op: the report names the same step, phase, layer and op as full mode.
One compiled call per step: a sentinel run takes no chunks of steps.
"""

from nanscope.data.targets import Arrays
from nanscope.engine.records import StepRecord
from nanscope.engine.step import InstrumentedStep
from nanscope.guard.options import GuardOptions
from nanscope.guard.schedule import AROUND, SampleSchedule


class TraceSentinel:
    """The sentinel of one trace-steps run.

    Args:
        engine: InstrumentedStep whose `keep_optimizer_state()` was called before it was traced.
        sample_every: int. Every Nth step runs in full.
    """

    def __init__(self, engine: InstrumentedStep, sample_every: int) -> None:
        self.engine = engine
        self.schedule = SampleSchedule(sample_every)
        self.light_steps = 0

    def run(self, step: int, x: Arrays, y: Arrays) -> StepRecord:
        """The StepRecord of one step: the full step when it is due, else the light one."""
        if self.schedule.due_full():
            return self.engine.run(step, x, y)
        self.light_steps += 1
        return self.engine.run_light(step, x, y)

    def completed(self, record: StepRecord, x: Arrays, y: Arrays, first_found: bool) -> StepRecord:
        """`record`, or when it is the run's first non-finite step and a light one, that step re-run in full from
        the state before it (a re-run that comes out finite, a transient fault, keeps the light record).
        A non-finite step also runs the next AROUND steps in full. `record.expected_nonfinite` is set."""
        if record.phase is None:
            return record
        self.schedule.around_event()
        if record.layers or first_found:
            return record
        full = self.engine.rerun_in_full(record.step, x, y)
        full.expected_nonfinite = list(record.expected_nonfinite)
        if full.phase is None:
            return record
        self.light_steps -= 1
        return full

    def around_event(self) -> None:
        """An intervention or a spike: the next AROUND steps run in full."""
        self.schedule.around_event()

    def notes(self) -> list[str]:
        return [f"mode=sentinel: full statistics on every {self.schedule.every}th step and the {AROUND} after an "
                f"event; {self.light_steps} step(s) recorded the scalars only (layer and variable tables are over "
                "the full steps)"]


def trace_sentinel(options: GuardOptions | None, engine: InstrumentedStep) -> TraceSentinel | None:
    """The TraceSentinel of a trace-steps run under `GuardOptions(mode="sentinel")` (before the step is traced: it
    copies the optimizer's state too), or None: full mode, or an engine without a light step (tf.distribute)."""
    if options is None or options.mode != "sentinel" or not engine.runs_light:
        return None
    engine.keep_optimizer_state()
    return TraceSentinel(engine, options.sample_every)
