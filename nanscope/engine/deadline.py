"""One watchdog thread that bounds every wait on the cluster of a multi-worker run.

`CommunicationOptions(timeout_seconds=...)` would bound each collective by itself, but
TensorFlow keeps that timer in a detached thread per collective that sleeps the whole
timeout (`Env::SchedClosureAfter`): at tens of steps a second and a 60 s timeout, tens of
thousands of threads are alive at once, and the workers abort near step 4,000 ("Resource
temporarily unavailable"). Instead, the strategy's collectives carry no timeout, and
one thread per process watches the one block (a step, the start-up) that is waiting on
the other workers: a block that outlasts the timeout aborts the process's collectives
with DeadlineExceeded, which the trace loop reports as the worker that did not answer.
"""

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

from nanscope.internals import abort_collective_ops


class CollectiveDeadline:
    """Abort this process's collectives when a bounded block takes longer than `timeout_s`.

    Args:
        timeout_s: float. train.distribute_timeout_s.
        abort: callable(message), optional. What a missed deadline does; by default
            `context.abort_collective_ops(DEADLINE_EXCEEDED, message)`.

    Example:
        deadline = CollectiveDeadline(60.0)
        with deadline.bounded():
            record = engine.run(step, x, y)   # DeadlineExceededError after 60 s without the peers
        deadline.close()
    """

    def __init__(self, timeout_s: float, abort: Callable[[str], object] | None = None) -> None:
        self.timeout_s = float(timeout_s)
        self._abort = abort or abort_collective_ops
        self._changed = threading.Condition()
        self._deadline: float | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def bounded(self) -> Iterator[None]:
        """A block whose collectives must finish within the timeout; blocks do not nest."""
        with self._changed:
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._watch, name="nanscope-collective-deadline", daemon=True)
                self._thread.start()
            self._deadline = time.monotonic() + self.timeout_s
            self._changed.notify()
        try:
            yield
        finally:
            with self._changed:
                self._deadline = None

    def close(self) -> None:
        """End the watchdog thread (a later `bounded` block is then not watched)."""
        with self._changed:
            self._closed = True
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    def _watch(self) -> None:
        with self._changed:
            while not self._closed:
                if self._deadline is None:
                    self._changed.wait()
                    continue
                left = self._deadline - time.monotonic()
                if left > 0:
                    self._changed.wait(left)
                    continue
                self._deadline = None
                self._abort(f"no answer from the other workers within {self.timeout_s:g} s")

