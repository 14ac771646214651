"""Where a run's model is built: the tf.distribute strategy and cluster that `train.distribute` asks for, the
start-up under a cluster (a collective that fails there is bad input, exit 2), and Keras' dtype policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nanscope.engine.cluster import bounded
from nanscope.errors import SpecError
from nanscope.runtime import tensorflow

if TYPE_CHECKING:
    from nanscope.engine.cluster import Cluster
    from nanscope.spec.sections import RunSpec


def distribution_strategy(spec: RunSpec) -> tuple[Any, Cluster | None]:
    """(strategy, cluster) that `train.distribute` asks for, or (None, None); contradicting settings are bad input."""
    kind = spec.train.distribute
    if kind is None:
        return None, None
    for name, value, clash in (("mixed_precision", spec.train.mixed_precision == "mixed_float16", "mixed_float16"),
                               ("jit_compile", spec.train.jit_compile, True)):
        if value:
            raise SpecError(f"{spec.source}: train.{name}: {clash} is not supported with train.distribute: {kind}",
                            hint=f"remove train.{name} or train.distribute")
    cluster = None
    if kind == "multi_worker":
        from nanscope.engine.cluster import multi_worker_strategy, read_tf_config

        cluster = read_tf_config(spec.source, spec.train.distribute_timeout_s)
        strategy = multi_worker_strategy(cluster)
    else:
        from nanscope.engine.distributed import mirrored_strategy

        strategy = mirrored_strategy()
    if spec.data.batch_size < strategy.num_replicas_in_sync:
        raise SpecError(f"{spec.source}: data.batch_size: {spec.data.batch_size} is smaller than the "
                        f"{strategy.num_replicas_in_sync} replicas of train.distribute: {kind}")
    return strategy, cluster


@contextlib.contextmanager
def start_up_failures(cluster: Cluster | None) -> Iterator[None]:
    """Under multi_worker, turn a collective that fails before the first step into ClusterError (exit 2)."""
    if cluster is None:
        yield
        return
    from nanscope.engine.cluster import ClusterError, collective_failure_message, is_collective_failure

    try:
        with bounded(cluster):
            yield
    except Exception as exc:
        if not is_collective_failure(exc):
            raise
        raise ClusterError(collective_failure_message(cluster, exc, None)) from exc


@contextlib.contextmanager
def dtype_policy(name: str | None) -> Iterator[None]:
    """Build under Keras' global dtype policy `name` (None: leave it), restoring the previous one after."""
    _, keras = tensorflow()
    if name is None:
        yield
        return
    previous = keras.mixed_precision.dtype_policy()
    keras.mixed_precision.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_dtype_policy(previous)
