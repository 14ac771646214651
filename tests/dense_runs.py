"""trace-steps on tests/specs/phase_models.py's dense model over given arrays, in process (the guard's tests).

Importing it puts tests/specs on sys.path, for `data_factories`.
"""

import sys
from pathlib import Path

import numpy as np

from nanscope.run.trace import run_trace
from nanscope.spec.load import parse_spec
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
BATCH = 16


def trace_dense(tmp_path, x, y, steps, optimizer=None, **options):
    """The TraceReport of `steps` steps of `optimizer` (default Adam at lr 0.01; MSE, seed 0, unshuffled batches of
    BATCH) on (x, y); `options` are TraceOptions fields (the trace goes to tmp_path/trace.jsonl unless `trace_path`
    says)."""
    np.savez(tmp_path / "d.npz", x=x, y=y)
    document = {"model": {"factory": f"{SPECS / 'phase_models.py'}:dense"},
                "data": {"path": "d.npz", "batch_size": BATCH, "shuffle": False},
                "train": {"loss": "mse", "optimizer": optimizer or {"name": "adam", "learning_rate": 0.01},
                          "steps": steps, "seed": 0}}
    spec = parse_spec(document, source=str(tmp_path / "spec.yaml"))
    return run_trace(spec, TraceOptions(**{"trace_path": tmp_path / "trace.jsonl", **options}))


if str(SPECS) not in sys.path:
    sys.path.insert(0, str(SPECS))
