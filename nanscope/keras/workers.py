"""Which worker of a `MultiWorkerMirroredStrategy` this process is, for the NanScope callback.

Every worker of a multi-worker `fit` runs the callback, and each one's step gathers
every replica's row, so every worker holds the same records. Only the chief writes
the report, the trace and the TensorBoard log: workers often share an output volume,
and two writers of one file would tear it. Replica ids are global and follow the
workers' order in the cluster (a `chief` task first, then the `worker` tasks), so
worker `w` holds replicas `w*R .. w*R+R-1`.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nanscope.runtime import tensorflow

from nanscope.tf_types import Strategy


@dataclass(frozen=True)
class WorkerRole:
    """This process's place in a multi-worker run; one worker, the chief, outside one.

    Args:
        workers: int, default 1. Workers in the cluster.
        index: int, default 0. This worker's position among them.
        chief: bool, default True. This worker writes the outputs.
    """

    workers: int = 1
    index: int = 0
    chief: bool = True

    def per_worker(self, replica_counts: Sequence[int]) -> list[int]:
        """Per worker, the sum of its replicas' counts; [] with one worker."""
        if self.workers <= 1 or not replica_counts:
            return []
        each = len(replica_counts) // self.workers
        return [int(sum(replica_counts[w * each:(w + 1) * each])) for w in range(self.workers)]


def worker_role(strategy: Strategy) -> WorkerRole:
    """The WorkerRole of this process under `strategy` (a model's `distribute_strategy`)."""
    tf, _ = tensorflow()
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return WorkerRole()
    resolver = strategy.cluster_resolver
    jobs = resolver.cluster_spec().as_dict()
    chiefs = len(jobs.get("chief", []))
    workers = chiefs + len(jobs.get("worker", []))
    if workers <= 1:
        return WorkerRole()
    index = 0 if resolver.task_type == "chief" else chiefs + int(resolver.task_id)
    return WorkerRole(workers, index, bool(strategy.extended.should_checkpoint))


def describe_strategy(strategy: Strategy, replicas: int, role: WorkerRole) -> dict[str, Any]:
    """The run header's `distribute` entry: strategy and replicas, and under several workers how they split."""
    if role.workers > 1:
        return {"strategy": "MultiWorkerMirroredStrategy", "replicas": replicas, "workers": role.workers,
                "replicas_per_worker": replicas // role.workers}
    return {"strategy": type(strategy).__name__, "replicas": replicas}
