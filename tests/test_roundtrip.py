"""Exact round trips: every JSON value and every trace line kind reads back as it was written.

NaN, +inf and -inf are spelled "nan", "inf" and "-inf"; -0.0 keeps its sign; denormals,
large step numbers, empty and non-ASCII names come back unchanged. A report redrawn from
its trace (`nanscope report TRACE`) is the run's report. No TensorFlow here: these are
synthetic runs written through the same writer (`trace.keep`, `trace.finish_trace`) as
trace-steps.

"Exact" is bit for bit, but for NaN, which JSON cannot carry a payload or sign for: a NaN
reads back as a NaN. The scalars lines keep every step's scalars as the run's own columns
hold them, float32 (`history.SERIES`): they are exact in float32.
"""

import json
import math
import struct

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nanscope.engine.records import LayerStats, OutputStats, StepRecord, VariableStats, record_from_dict
from nanscope.store.history import StepHistory
from nanscope.jsonio import dumps, encode_float, jsonable
from nanscope.report.model import FirstNonfinite, TraceReport
from nanscope.report.redraw import load_trace
from nanscope.rules.catalogue import recommend
from nanscope.run.trace import finish_trace, keep
from nanscope.store.lines import StepLine
from nanscope.store.tracefile import TraceWriter

FLOAT32_MAX = float(np.finfo(np.float32).max)
# Non-finite values, signed zeros, the smallest float32 and float64 denormals, the smallest normals, the largest.
EDGES32 = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.401298464324817e-45, -1.401298464324817e-45,
           1.1754943508222875e-38, FLOAT32_MAX, -FLOAT32_MAX, 16777217.0]
EDGES = [*EDGES32, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, 2.0 ** 53 + 2]
FLOATS = st.one_of(st.sampled_from(EDGES), st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True))
# What a step's record holds: float32 values, read out of the step's float32 arrays (engine/records.py).
FLOATS32 = st.one_of(st.sampled_from(EDGES32),
                     st.floats(width=32, allow_nan=True, allow_infinity=True, allow_subnormal=True))
COUNTS = st.integers(0, 2 ** 31 - 1)
STEPS = st.integers(0, 2 ** 53)
NAMES = st.one_of(st.sampled_from(["", "dense", "héad/kernél", "层/权重", "a\u0000b", "tab\tand\nnewline", "nan",
                                   "-inf", "\U0001f600"]), st.text(max_size=12))


def same(a, b):
    """Equal bit for bit (the sign of a zero included); any NaN equals any NaN."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or struct.pack("<d", a) == struct.pack("<d", b)
    return type(a) is type(b) and a == b


def same_fields(a, b):
    assert type(a) is type(b)
    for name, value in vars(a).items():
        other = getattr(b, name)
        if isinstance(value, list):
            assert len(value) == len(other), name
            for x, y in zip(value, other):
                if hasattr(x, "__dict__"):
                    same_fields(x, y)
                else:
                    assert same(x, y), (name, x, y)
        elif hasattr(value, "__dict__"):
            same_fields(value, other)
        else:
            assert same(value, other), (name, value, other)


@settings(deadline=None)  # no wall-clock deadline: on a loaded machine, or under mutmut's tracing, a case takes 0.4 s
@given(FLOATS)
def test_a_float_is_spelled_and_read_back_exactly(value):
    text = dumps({"v": value}, indent=None)
    read = json.loads(text)["v"]
    if math.isfinite(value):
        assert same(read, value)
    else:
        assert read == ("nan" if math.isnan(value) else "inf" if value > 0 else "-inf")
        assert same(float(read), value)
    assert json.loads(dumps([np.float32(value)], indent=None))[0] == encode_float(float(np.float32(value)))


def test_the_three_non_finite_spellings():
    assert [encode_float(v) for v in (math.nan, math.inf, -math.inf)] == ["nan", "inf", "-inf"]
    assert jsonable({"a": [np.float64(-np.inf), np.float16(np.inf)], 3: (np.nan,)}) == {"a": ["-inf", "inf"],
                                                                                         "3": ["nan"]}
    assert dumps(-math.inf, indent=None) == '"-inf"'


layer_stats = st.builds(LayerStats, FLOATS32, FLOATS32, COUNTS, st.one_of(st.none(), FLOATS32), FLOATS32, st.booleans(),
                        FLOATS32)
variable_stats = st.builds(VariableStats, FLOATS32, COUNTS, FLOATS32, FLOATS32, COUNTS)
output_stats = st.builds(OutputStats, FLOATS32, COUNTS, COUNTS)


@st.composite
def records(draw, layers=2, variables=2, outputs=0, step=STEPS):
    return StepRecord(
        step=draw(step), batch_rows=draw(COUNTS), loss=draw(FLOATS32), data_loss=draw(FLOATS32),
        grad_global_norm=draw(FLOATS32), applied_grad_global_norm=draw(FLOATS32), x_nonfinite=draw(COUNTS),
        y_nonfinite=draw(COUNTS), output_nonfinite=draw(COUNTS), loss_nonfinite=draw(st.booleans()),
        grad_nonfinite=draw(COUNTS), weights_nonfinite=draw(COUNTS),
        layers=draw(st.lists(layer_stats, min_size=layers, max_size=layers)),
        variables=draw(st.lists(variable_stats, min_size=variables, max_size=variables)),
        model_loss_term=draw(FLOATS32), expected_nonfinite=draw(st.lists(st.integers(0, layers), max_size=2)),
        loss_scale=draw(st.one_of(st.none(), FLOATS32)), update_skipped=draw(st.booleans()),
        loss_scale_before=draw(st.one_of(st.none(), FLOATS32)), loss_missing=draw(st.booleans()),
        replica_nonfinite=draw(st.lists(COUNTS, max_size=3)), worker_nonfinite=draw(st.lists(COUNTS, max_size=2)),
        outputs=draw(st.lists(output_stats, min_size=outputs, max_size=outputs)),
    )


@settings(deadline=None)
@given(records(outputs=2))
def test_a_step_line_reads_back_as_its_record(record):
    line = json.loads(dumps(StepLine(record).to_json(), indent=None))
    assert line["kind"] == "step" and line["phase"] == record.phase
    same_fields(record_from_dict(line), record)


def f32(value):
    with np.errstate(over="ignore"):
        return np.float32(value)


def same32(a, b):
    """Equal as float32 bit patterns; any NaN equals any NaN."""
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    nan = np.isnan(a)
    return a.shape == b.shape and bool((nan == np.isnan(b)).all()) and a[~nan].tobytes() == b[~nan].tobytes()


def write_run(path, records, names, first=None, keep_steps=2, sample=2, recommendations=()):
    layers, variables, outputs = names["layers"], names["variables"], names["outputs"]
    run = {"spec": names["spec"], "optimizer_config": {"learning_rate": 0.5}, "output_names": outputs,
           "layer_dtypes": {name: "float32" for name, _ in layers}}
    report = TraceReport(run=run, layers=layers, layer_order=[n for n, _ in layers], variables=variables,
                         history=StepHistory(len(layers), len(variables), len(outputs), keep_steps, sample),
                         first_nonfinite=first, recommendations=list(recommendations), trace_path=str(path),
                         validation_loss=names["validation_loss"], notes=[names["spec"]])
    with TraceWriter(path, report.trace_header(), report.history) as writer:
        for record in records:
            keep(report.history, writer, record)
        finish_trace(writer, report)
    return report


@st.composite
def runs(draw):
    layer_count, variable_count, output_count = draw(st.integers(0, 2)), draw(st.integers(0, 2)), draw(
        st.sampled_from([0, 2]))
    count = draw(st.integers(1, 9))
    start = draw(st.integers(0, 2 ** 53 - 10))
    steps = [start + i for i in range(count)]
    rows = [draw(records(layer_count, variable_count, output_count, st.just(s))) for s in steps]
    for row in rows:  # indices of layers that exist
        row.expected_nonfinite = [i for i in row.expected_nonfinite if i < layer_count]
    names = {
        "layers": [(draw(NAMES), draw(NAMES)) for _ in range(layer_count)],
        "variables": [draw(NAMES) for _ in range(variable_count)],
        "outputs": [draw(NAMES) for _ in range(output_count)],
        "spec": draw(NAMES), "validation_loss": draw(st.one_of(st.none(), FLOATS32)),
    }
    return rows, names


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(runs())
def test_the_scalars_lines_hold_every_step_as_the_run_does(tmp_path, run):
    rows, names = run
    path = tmp_path / "t.jsonl"
    written = write_run(path, rows, names)
    redrawn = load_trace(path)
    assert redrawn.steps_run == written.steps_run == len(rows)
    assert redrawn.history.steps().tolist() == [r.step for r in rows]
    for column in written.history.series.columns:
        assert same32(redrawn.history.column(column), written.history.column(column)), column


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(runs(), st.lists(FLOATS, min_size=4, max_size=4), NAMES)
def test_a_redrawn_report_is_the_runs_report(tmp_path, run, operand, name):
    rows, names = run
    inputs = dict(zip(("min", "max", "zero_fraction", "negative_fraction"), operand))
    first = FirstNonfinite(step=rows[-1].step, phase="forward", layer=name, layer_class=name, op="Exp",
                           inputs={"op": "Exp", "dtype": "float16", **inputs}, detail=[name],
                           context={"masked_rows": 1, "fill": {"op": name, "source": None}})
    found = [recommend("stable-exp", "error", [f"evidence {name}"], data={"max": operand[1], "layer": name})]
    path = tmp_path / "t.jsonl"
    written = write_run(path, rows, names, first, recommendations=found)
    document = json.loads(dumps(written.to_json()))
    assert json.loads(dumps(load_trace(path).to_json())) == document
    assert document["run"]["spec"] == names["spec"] and document["steps_total"] == len(rows)
    assert [s["step"] for s in document["steps"]] == [r.step for r in written.records]


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(FLOATS32, min_size=1, max_size=6))
def test_the_aggregates_line_reads_back_exactly(tmp_path, values):
    names = {"layers": [("l", "Dense")], "variables": ["l/kernel"], "outputs": ["a", "b"], "spec": "s",
             "validation_loss": None}
    rows = [StepRecord(step=s, batch_rows=1, loss=v, data_loss=v, grad_global_norm=v, applied_grad_global_norm=v,
                       x_nonfinite=0, y_nonfinite=0, output_nonfinite=0, loss_nonfinite=False, grad_nonfinite=0,
                       weights_nonfinite=0, layers=[LayerStats(v, v, 0, v, v, underflow_fraction=v)],
                       variables=[VariableStats(v, 0, v, v, 0)], outputs=[OutputStats(v, 0, 0), OutputStats(-v, 1, 2)])
            for s, v in enumerate(values)]
    path = tmp_path / "t.jsonl"
    written = write_run(path, rows, names, keep_steps=1)
    redrawn = load_trace(path)
    for mine, theirs in ((written.history.layers, redrawn.history.layers),
                         (written.history.variables, redrawn.history.variables),
                         (written.history.outputs, redrawn.history.outputs)):
        for a, b in zip(mine, theirs, strict=True):
            same_fields(a, b)


def test_minus_zero_and_a_float64_column_read_back_as_the_run_holds_them(tmp_path):
    """The two cases the scalars lines got wrong, pinned: -0.0 read back as +0.0, and a float64 column
    (the weight norm, sqrt(16777217^2 + 1) here) rounded twice, to 16777216, while the run holds 16777218."""
    names = {"layers": [], "variables": ["a", "b"], "outputs": [], "spec": "s", "validation_loss": None}
    row = StepRecord(step=2 ** 40, batch_rows=8, loss=-0.0, data_loss=-0.0, grad_global_norm=-0.0,
                     applied_grad_global_norm=1e-45, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                     loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0,
                     variables=[VariableStats(1.0, 0, 16777217.0, 0.0, 0), VariableStats(1.0, 0, 1.0, 0.0, 0)])
    written = write_run(tmp_path / "t.jsonl", [row], names)
    redrawn = load_trace(tmp_path / "t.jsonl").history
    assert np.signbit(redrawn.column("loss")[0]) and redrawn.column("loss")[0] == 0.0
    assert redrawn.column("weight_norm")[0] == written.history.column("weight_norm")[0] == 16777218.0
    assert redrawn.column("applied_grad_global_norm")[0] == float(np.float32(1e-45))
    assert redrawn.steps().tolist() == [2 ** 40]


def test_arrays_paths_and_numpy_scalars_are_plain_json():
    from pathlib import Path

    assert jsonable(np.array([[1.5, np.nan], [-np.inf, -0.0]])) == [[1.5, "nan"], ["-inf", -0.0]]
    assert jsonable({"p": Path("runs/a b.json"), "n": np.int64(2 ** 40), "b": np.bool_(True), "t": (1, None)}) == {
        "p": "runs/a b.json", "n": 2 ** 40, "b": True, "t": [1, None]}
    assert type(jsonable(np.int64(3))) is int and type(jsonable(np.bool_(False))) is bool
