"""Training on several machines: the cluster TF_CONFIG describes, its strategy, and a worker that goes missing.

Every worker runs the same command with its own `TF_CONFIG`. `read_tf_config` reads and
checks it once; `multi_worker_strategy` creates `tf.distribute.MultiWorkerMirroredStrategy`
before TensorFlow starts its devices (its collective runtime must be configured first),
with every wait bounded by `train.distribute_timeout_s`:

- joining: before TensorFlow joins the cluster, each worker listens on its port until every
  other worker's port answers, and otherwise stops (exit 2) naming the ones that did not;
- each block that waits on the others (a step, whose gradient all-reduce also carries the
  replicas' rows; the model's build, with the variables' initial broadcast) is `bounded`:
  its collectives fail with DeadlineExceeded after the timeout (engine/deadline.py), or at
  once with Unavailable when a peer's connection drops; `missing_worker` names the task.

Only the chief (task 0) writes the report and the other outputs; it publishes its exit
code in the coordination service's key-value store, and the others exit with it.
"""

import json
import os
import contextlib
import faulthandler
import functools
import re
import socket
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nanscope.engine.deadline import CollectiveDeadline
from nanscope.errors import NanscopeError
from nanscope.internals import (
    configure_coordination, get_config_key_value, local_devices_chosen, set_config_key_value,
)

EXIT_CODE_KEY = "nanscope/exit_code"


class ClusterError(NanscopeError):
    """A worker is missing or stopped answering. Exit 2 before the first step; the trace loop ends the run with 1."""


@dataclass(frozen=True)
class Cluster:
    """The workers of a multi-worker run and which one this process is.

    Args:
        workers: tuple of str. "host:port" of every worker, in task order.
        task: int. This worker's index; task 0 is the chief.
        timeout_s: float. How long to wait for a missing or silent worker.
    """

    workers: tuple[str, ...]
    task: int
    timeout_s: float = 60.0

    @property
    def is_chief(self) -> bool:
        """True for task 0, the worker that writes the report."""
        return self.task == 0

    @property
    def role(self) -> str:
        """"chief (worker task 0 of 2)" or "worker task 1 of 2"."""
        return f"{'chief (worker task 0' if self.is_chief else f'worker task {self.task}'} of {len(self.workers)}" + (
            ")" if self.is_chief else "")

    def describe(self, task: int) -> str:
        """"worker task 1 (10.0.0.2:2222)"."""
        return f"worker task {task} ({self.workers[task]})"


def read_tf_config(source: str | None, timeout_s: float, environ: Mapping[str, str] | None = None) -> Cluster:
    """The Cluster that the `TF_CONFIG` environment variable describes; bad input raises NanscopeError.

    Args:
        source: str. The spec file, named in errors.
        timeout_s: float. train.distribute_timeout_s.
        environ: mapping, default os.environ.
    """
    raw = (os.environ if environ is None else environ).get("TF_CONFIG")
    where = f"{source}: train.distribute: multi_worker: TF_CONFIG"
    if not raw:
        example = '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
        raise NanscopeError(f"{where} is not set", hint=f"set it on every worker, e.g. {example}")
    try:
        config = json.loads(raw)
    except ValueError as exc:
        raise NanscopeError(f"{where} is not JSON: {exc}. Received: {raw[:200]!r}") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    workers = cluster.get("worker") if isinstance(cluster, dict) else None
    if not isinstance(cluster, dict) or not isinstance(workers, list) or not workers or not all(
            isinstance(w, str) and ":" in w for w in workers):
        raise NanscopeError(f"{where}: `cluster.worker` must be a list of \"host:port\". Received: {workers!r}")
    others = sorted(set(cluster) - {"worker"})
    if others:
        raise NanscopeError(f"{where}: only `worker` tasks are supported (task 0 is the chief). "
                            f"Received jobs: {', '.join(others)}")
    if not isinstance(task, dict) or task.get("type") != "worker":
        raise NanscopeError(f"{where}: `task.type` must be \"worker\". Received: task={task!r}")
    index = task.get("index")
    if not isinstance(index, int) or not 0 <= index < len(workers):
        raise NanscopeError(f"{where}: `task.index` must be a whole number from 0 to {len(workers) - 1}. "
                            f"Received: index={index!r}")
    return Cluster(tuple(workers), index, float(timeout_s))


def multi_worker_strategy(cluster: Cluster) -> Any:
    """Start this worker's collective runtime and return its MultiWorkerMirroredStrategy.

    TensorFlow must not have started its devices yet in this process. Each worker uses
    its GPUs, or without GPUs every logical CPU (`NANSCOPE_CPU_REPLICAS`), as `mirrored` does.
    """
    from nanscope.runtime import tensorflow

    made: list[Any] = []
    try:
        tensorflow(before_devices=lambda tf: made.append(_create(tf, cluster)))
    except RuntimeError as exc:
        if made:
            raise
        raise NanscopeError("train.distribute: multi_worker must start TensorFlow's collective runtime before "
                            "anything else in the process uses TensorFlow", hint="run `nanscope trace-steps` "
                            "in its own process on every worker") from exc
    return made[0]


def _create(tf: Any, cluster: Cluster) -> Any:
    timeout_ms = int(cluster.timeout_s * 1000)
    configure_coordination(len(cluster.workers), timeout_ms, timeout_ms, min(timeout_ms, 10_000))
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": list(cluster.workers)},
                                          "task": {"type": "worker", "index": cluster.task}})
    wait_for_workers(cluster)
    # TensorFlow holds the GIL while the cluster forms, so no Python thread can watch that wait. A worker that
    # left in the moment between the handshake and the join would hang it: faulthandler's C thread ends the
    # process then (exit 1, after twice the timeout).
    faulthandler.dump_traceback_later(2 * cluster.timeout_s, exit=True, file=sys.__stderr__ or sys.stderr)
    try:
        # No `timeout_seconds` in the CommunicationOptions: TensorFlow would keep one sleeping thread per collective
        # for the whole timeout (thousands at once); `bounded` watches the steps from one thread instead.
        with _every_logical_cpu(tf):
            return tf.distribute.MultiWorkerMirroredStrategy()
    finally:
        faulthandler.cancel_dump_traceback_later()


def bounded(cluster: Cluster | None) -> contextlib.AbstractContextManager[None]:
    """A block whose collectives fail with DeadlineExceeded after `cluster.timeout_s`; no bound without a cluster."""
    if cluster is None:
        return contextlib.nullcontext()
    return _deadline(cluster.timeout_s).bounded()


@functools.cache
def _deadline(timeout_s: float) -> CollectiveDeadline:
    return CollectiveDeadline(timeout_s)  # one watchdog thread per process, for the whole run


def _every_logical_cpu(tf: Any) -> contextlib.AbstractContextManager[None]:
    """While the strategy is made, give a CPU-only worker one replica per logical CPU (TensorFlow gives one).

    Through `internals.local_devices_chosen` (the strategy's `_initialize_local_devices`).
    tests/test_multi_worker.py runs 2 logical CPUs per worker through it.
    """
    count = _logical_cpus(tf)

    def choose(devices: tuple[str, ...], kind: str, worker_device: str) -> tuple[tuple[str, ...], str]:
        if kind == "CPU" and count > 1:
            devices = tuple(f"{worker_device}/device:CPU:{i}" for i in range(count))
        return devices, kind

    return local_devices_chosen(choose)


def _logical_cpus(tf: Any) -> int:
    """Logical CPUs configured for the first CPU (before the devices start), 1 when it is not split."""
    configured = tf.config.get_logical_device_configuration(tf.config.list_physical_devices("CPU")[0])
    return len(configured) if configured else 1


def wait_for_workers(cluster: Cluster) -> None:
    """Before TensorFlow joins the cluster: listen on this worker's port until every other worker's answers.

    A worker that never starts (a wrong address, a crash at import) would otherwise hang the
    others inside TensorFlow's join; this handshake names it instead. Raises ClusterError
    (exit 2) when some worker has not answered within the timeout.
    """
    host, _, port = cluster.workers[cluster.task].rpartition(":")
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind(("", int(port)))
        listener.listen(64)
    except (OSError, ValueError) as exc:
        listener.close()
        raise ClusterError(f"train.distribute: multi_worker: cannot listen on {cluster.workers[cluster.task]}, "
                           f"this worker's address in TF_CONFIG: {exc}") from None
    deadline = time.monotonic() + cluster.timeout_s
    try:
        missing = unreachable_workers(cluster)
        while missing and time.monotonic() < deadline:
            time.sleep(0.2)
            missing = unreachable_workers(cluster, missing)
    finally:
        listener.close()  # connections still queued are reset, so the port is free for TensorFlow's server
    if missing:
        raise ClusterError(f"train.distribute: multi_worker: {', '.join(cluster.describe(t) for t in missing)} did "
                           f"not join within {cluster.timeout_s:g} s (train.distribute_timeout_s); every worker must "
                           "run the same command with its own TF_CONFIG")


def unreachable_workers(cluster: Cluster, tasks: Iterable[int] | None = None) -> list[int]:
    """Those of `tasks` (default: every other task) whose address does not accept a connection within a second."""
    missing: list[int] = []
    for task in tasks if tasks is not None else range(len(cluster.workers)):
        if task == cluster.task:
            continue
        host, _, port = cluster.workers[task].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=1.0):
                pass
        except (OSError, ValueError):
            missing.append(task)
    return missing


def is_collective_failure(exc: BaseException) -> bool:
    """True for the errors a collective raises when a peer is gone, silent or has failed."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    failures = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError, tf.errors.AbortedError,
                tf.errors.CancelledError, tf.errors.FailedPreconditionError)
    return isinstance(exc, failures) or (isinstance(exc, tf.errors.InternalError) and "ollective" in str(exc))


def missing_worker(cluster: Cluster, exc: BaseException) -> str:
    """"worker task 1 (host:port)": the peer a failed collective names, else the one whose port is closed."""
    named = {int(t) for t in re.findall(r"/job:worker/replica:\d+/task:(\d+)", str(exc))} - {cluster.task}
    tasks = sorted(t for t in named if t < len(cluster.workers)) or unreachable_workers(cluster)
    if not tasks:
        return "a worker"
    return ", ".join(cluster.describe(t) for t in tasks)


def collective_failure_message(cluster: Cluster, exc: BaseException, step: int | None) -> str:
    """One line: which worker went missing, at which step, and how long this one waited at most."""
    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    how = (f"did not answer within {cluster.timeout_s:g} s (train.distribute_timeout_s)"
           if isinstance(exc, tf.errors.DeadlineExceededError) else "stopped answering")
    when = f"at step {step}" if step is not None else "before the first step"
    return f"train.distribute: multi_worker: {missing_worker(cluster, exc)} {how} {when}"


def publish_exit_code(code: int) -> None:
    """The chief: tell the other workers which exit code the run ends with."""
    # If this fails, the others fall back to their own verdict; the chief's report is written already.
    with contextlib.suppress(Exception):
        set_config_key_value(EXIT_CODE_KEY, str(int(code)))


def chief_exit_code(cluster: Cluster) -> int | None:
    """A non-chief worker: the chief's exit code, once it has written its report; None if it never says."""
    try:
        # The chief may still be replaying the failing step and writing its outputs: ten timeouts at most.
        value = get_config_key_value(EXIT_CODE_KEY, int(cluster.timeout_s * 10_000))
        return int(value)
    except Exception:
        return None
