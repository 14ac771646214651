"""Every step's scalars: the report's overview of them, and a redrawn report that does not hold them."""

import io
import json
import math
import tracemalloc

import numpy as np
import pytest
from rich.console import Console

from nanscope.engine.records import StepRecord
from nanscope.engine.schema import LAYER, SCALARS, VARIABLE, StepLayout
from nanscope.store.history import StepHistory
from nanscope.store.rows import series_columns
from nanscope.render.format import sparkline
from nanscope.render.trace_report import render_trace_report
from nanscope.report.redraw import load_trace
from nanscope.store.lines import AggregatesLine, ScalarsLine, SummaryLine
from nanscope.store.overview import OverviewFold
from nanscope.store.series import ScalarColumns
from nanscope.store.tracefile import TraceWriter

LAYOUT = StepLayout(outputs=0, layers=3, terms=4, variables=4)


def reference_points(values, width=60):
    """The curve's buckets, slowly: the smallest power-of-two size that needs at most 2 * width of them."""
    size = 1
    while -(-len(values) // size) > 2 * width:
        size *= 2
    buckets = [values[i:i + size] for i in range(0, len(values), size)]
    return [math.nan if any(not math.isfinite(v) for v in b) else max(abs(v) for v in b) for b in buckets]


@pytest.mark.parametrize("count", [0, 1, 59, 60, 61, 120, 121, 5000])
def test_the_overview_folds_every_step_in_bounded_size(count):
    columns = series_columns(0)
    series, rng = ScalarColumns(columns), np.random.default_rng(count)
    for step in range(count):
        row = rng.random(len(columns)) * 10 - 5
        row[columns.at("phase")] = 3 if step == count - 7 else 0
        row[columns.at("loss")] = [math.nan, math.inf, -1e30, 2.0][step % 4] if step % 97 == 5 else row[0]
        row[columns.at("loss_scale")] = 0 if step % 3 else step
        series.append(step, row.tolist())
    seen = series.overview()
    for name in ("loss", "grad_global_norm"):
        values = series.column(name).tolist()
        points = seen.curves[name].points
        assert len(points) <= 120
        np.testing.assert_array_equal(points, reference_points(values))  # the slow, obvious reference
        if count <= 120:  # a short run's sparkline is the one of its every step
            assert sparkline(points) == sparkline(values)
        assert seen.curves[name].last == (values[-1] if values else None)
        finite = [v for v in values if math.isfinite(v)]
        assert seen.curves[name].first_finite == (finite[0] if finite else values[0] if values else None)
    scales = [s for s in series.column("loss_scale").tolist() if s]
    assert seen.last_loss_scale == (scales[-1] if scales else None)
    assert seen.skipped_updates == int((series.column("update_skipped") != 0).sum())
    assert seen.first_nonfinite == ((count - 7, 3) if count >= 7 else None)

    # Folded in chunks of any size, as a trace streams past: the same overview.
    fold, start = OverviewFold(columns), 0
    steps, values = series.steps(), np.concatenate([v for _, v in series.chunks()]) if count else None
    while start < count:
        end = start + int(rng.integers(1, 300))
        fold.add(steps[start:end], values[start:end])
        start = end
    assert repr(fold.overview()) == repr(seen)


def synthetic_trace(path, steps, real=64):
    """A trace of `steps` steps: the full rows and scalars of the first `real` steps as a run writes them, then
    scalars lines of 32 steps (step 0's scalars, the loss varying), then the aggregates and a summary."""
    rng = np.random.default_rng(0)
    history = StepHistory(layers=3, variables=4, keep=4, sample=8)
    header = {"run": {"model": "synthetic", "steps_requested": steps}, "layers": [[f"d{i}", "Dense"] for i in range(3)],
              "layer_order": [f"d{i}" for i in range(3)], "variables": [f"v{i}" for i in range(4)]}
    with TraceWriter(path, header, history) as writer:
        for step in range(real):
            scalars, layers, terms, variables = (rng.random(shape) for shape in LAYOUT.shapes)
            scalars[[SCALARS.at(n) for n in SCALARS if "nonfinite" in n or "skipped" in n or "scale" in n]] = 0
            layers[:, LAYER.at("nonfinite")] = 0
            variables[:, [VARIABLE.at("grad_nonfinite"), VARIABLE.at("weight_nonfinite")]] = 0
            record = StepRecord.from_arrays(step, 16, scalars, layers, terms, variables)
            writer.step(record, history.add(record))
            writer.flush_steps()
        template = [float(history.series.column(name)[0]) for name in history.series.columns]
        loss = history.series.columns.at("loss")
        for start in range(real, steps, 32):
            rows = [[step, *template[:loss], 1.0 + (step % 13), *template[loss + 1:]]
                    for step in range(start, min(start + 32, steps))]
            writer.write(ScalarsLine(rows))
        writer.rows(history.unwritten())
        writer.write(AggregatesLine.of(history))
        writer.write(SummaryLine())


def redraw_peak(path):
    """Peak bytes Python allocated while loading the trace, rendering it and making its JSON; the report."""
    tracemalloc.start()
    try:
        report = load_trace(path)
        render_trace_report(report, Console(file=io.StringIO(), width=120))
        json.dumps(report.to_json())
        return tracemalloc.get_traced_memory()[1], report
    finally:
        tracemalloc.stop()


def test_a_redrawn_report_does_not_grow_with_the_trace(tmp_path):
    synthetic_trace(tmp_path / "short.jsonl", 3_000)
    synthetic_trace(tmp_path / "long.jsonl", 30_000)
    redraw_peak(tmp_path / "short.jsonl")  # imports and caches of a first call are not the trace's
    short, short_report = redraw_peak(tmp_path / "short.jsonl")
    long, long_report = redraw_peak(tmp_path / "long.jsonl")
    assert (short_report.steps_run, long_report.steps_run) == (3_000, 30_000)
    assert long_report.history.series.nbytes == 0
    # Holding every step's scalars would take >= 27,000 x 68 bytes (1.8 MB) more for the long trace.
    assert long - short < 200_000, (short, long)
    # What it holds instead still gives every step's scalars to a caller that asks.
    loss = long_report.history.column("loss")
    assert len(loss) == 30_000 and loss[-1] == 1.0 + (29_999 % 13)
    np.testing.assert_array_equal(long_report.history.steps(), np.arange(30_000))
