"""Which executions of a sentinel run are run in full: every Nth, and the ones right after an event."""

AROUND = 16  # executions run in full after an event


class SampleSchedule:
    """The sentinel's sampling of full steps: every `every`-th execution (the first included) and the `AROUND`
    executions after an event (a non-finite step, an intervention, a spike).

    Args:
        every: int. Every Nth execution runs the full step (`GuardOptions.sample_every`).

    Example:
        schedule = SampleSchedule(100)
        full = schedule.due_full()  # before each execution
    """

    def __init__(self, every: int) -> None:
        self.every = every
        self.calls, self.full_until = 0, 0

    def due_full(self) -> bool:
        """Before each execution: True when this one runs the full step (sampled, or after an event)."""
        full = self.calls % self.every == 0 or self.calls < self.full_until
        self.calls += 1
        return full

    def around_event(self) -> None:
        """The next AROUND executions run in full."""
        self.full_until = self.calls + AROUND
