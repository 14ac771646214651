"""Bounded history: every step's scalars, a bounded set of full rows, exact aggregates, and the same findings."""

import json
import math
import os
import re

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from nanscope.cli import app
from nanscope.engine.records import StepRecord
from nanscope.engine.schema import LAYER, SCALARS, VARIABLE, StepLayout
from nanscope.store.history import StepHistory
from nanscope.report.redraw import load_trace
from nanscope.spec.load import apply_overrides, load_spec
from nanscope.run.trace import run_trace
from nanscope.spec.options import TraceOptions

SPECS = Path(__file__).parent / "specs"
LAYOUT = StepLayout(outputs=0, layers=3, terms=4, variables=4)


def synthetic_records(count, seed=0, bad_from=None, skipped_at=(), spike_at=None, bound_at=None, float16_at=None):
    """StepRecords from random step outputs; non-finite layer and gradient values from `bad_from` on; a loss
    of 1e6 at `spike_at` (the others are below 10); a layer output of 1e20 at `bound_at`, and of 1000 in the
    second layer at `float16_at`."""
    rng = np.random.default_rng(seed)
    for step in range(count):
        scalars, layers, terms, variables = (rng.random(shape) * 10 for shape in LAYOUT.shapes)
        scalars[[SCALARS.at(n) for n in ("x_nonfinite", "y_nonfinite", "output_nonfinite", "loss_nonfinite",
                                         "grad_nonfinite", "weights_nonfinite", "loss_scale", "update_skipped")]] = 0
        layers[:, LAYER.at("nonfinite")] = 0
        layers[:, LAYER.at("size")] = 100
        variables[:, [VARIABLE.at("grad_nonfinite"), VARIABLE.at("weight_nonfinite")]] = 0
        if bad_from is not None and step >= bad_from:
            layers[1, LAYER.at("nonfinite")] = 3
            variables[2, VARIABLE.at("grad_nonfinite")] = 1
        if step in skipped_at:
            scalars[SCALARS.at("update_skipped")] = 1
        if step == spike_at:
            scalars[SCALARS.at("loss")] = 1e6
        if step == bound_at:
            layers[0, LAYER.at("max_abs")] = 1e20  # past sqrt(float32 max) = 1.8e19
        if step == float16_at:
            layers[1, LAYER.at("max_abs")] = 1000.0  # past a hundredth of float16's max, far below float32's bound
        yield StepRecord.from_arrays(step, 16, scalars, layers, terms, variables)


def test_warning_onsets_keep_their_neighbours_rows():
    # A loss spike and a layer output past the float32 activation bound, each mid-run, far from the
    # first and last steps and off the sample's stride: their rows and their neighbours' are kept.
    history = StepHistory(layers=3, variables=4, keep=5, sample=4)
    for record in synthetic_records(3000, spike_at=1001, bound_at=2001):
        history.add(record)
    steps = {r.step for r in history.kept()}
    assert (history.first_spike_step, history.first_bound_step) == (1001, 2001)
    for event in (1001, 2001):
        assert set(range(event - 5, event + 6)) <= steps, event
    assert "the first loss spike" in history.sampling_note()
    # Without them, those steps are not kept: the rows above are the events' doing.
    plain = StepHistory(layers=3, variables=4, keep=5, sample=4)
    for record in synthetic_records(3000):
        plain.add(record)
    assert not {1001, 2001} & {r.step for r in plain.kept()}
    assert (plain.first_spike_step, plain.first_bound_step) == (None, None)


def test_a_float16_layer_past_its_own_activation_bound_is_an_event(tmp_path):
    # The bounded-activation rule warns at a hundredth of 65504 for a float16 layer (engine.limits), so
    # that layer's first step past it keeps its neighbours' rows; for a float32 layer 1000 is nothing.
    from nanscope.store.lines import AggregatesLine
    from nanscope.store.tracefile import TraceWriter

    dtypes = ["float32", "float16", "float32"]
    mixed = StepHistory(layers=3, variables=4, keep=5, sample=4, layer_dtypes=dtypes)
    plain = StepHistory(layers=3, variables=4, keep=5, sample=4)
    header = {"run": {"layer_dtypes": dict(zip(("d0", "d1", "d2"), dtypes))},
              "layers": [("d0", "Dense"), ("d1", "Dense"), ("d2", "Dense")], "layer_order": [], "variables": []}
    with TraceWriter(tmp_path / "t.jsonl", header, mixed) as writer:
        for record in synthetic_records(3000, float16_at=1501):
            writer.step(record, mixed.add(record))
            plain.add(record)
            writer.flush_steps()
        writer.rows(mixed.unwritten())
        writer.write(AggregatesLine.of(mixed))
    assert (mixed.first_bound_step, plain.first_bound_step) == (1501, None)
    kept = [r.step for r in mixed.kept()]
    assert set(range(1496, 1507)) <= set(kept) and 1501 not in {r.step for r in plain.kept()}
    # A report redrawn from the trace keeps the run's rows: the run wrote why it kept each one.
    redrawn = load_trace(tmp_path / "t.jsonl")
    assert [r.step for r in redrawn.records] == kept
    assert redrawn.history.sampling_note() == mixed.sampling_note()


@pytest.mark.parametrize("events", [{}, {"spike_at": 777, "skipped_at": (1900,)}, {"bound_at": 1234, "bad_from": 2500}])
def test_a_long_run_redrawn_from_its_trace_keeps_the_runs_rows(events, tmp_path):
    from nanscope.store.lines import AggregatesLine
    from nanscope.store.tracefile import TraceWriter

    history = StepHistory(layers=3, variables=4, keep=5, sample=4)
    header = {"run": {}, "layers": [("d0", "Dense"), ("d1", "Dense"), ("d2", "Dense")], "layer_order": [],
              "variables": [f"v{i}" for i in range(4)]}
    with TraceWriter(tmp_path / "t.jsonl", header, history) as writer:
        for record in synthetic_records(3000, seed=len(events), **events):
            writer.step(record, history.add(record))
            writer.flush_steps()
        writer.rows(history.unwritten())
        writer.write(AggregatesLine.of(history))
    redrawn = load_trace(tmp_path / "t.jsonl").history
    assert [r.step for r in redrawn.kept()] == [r.step for r in history.kept()]
    assert redrawn.sampling_note() == history.sampling_note() and redrawn.count == 3000


def test_full_rows_stay_bounded_and_aggregates_stay_exact():
    history, every = StepHistory(layers=3, variables=4, keep=10, sample=20), []
    written = []
    for record in synthetic_records(5000, bad_from=3000, skipped_at=(1200,)):
        written += history.add(record)
        every.append(record)
    written += history.unwritten()

    kept = history.kept()
    steps = [r.step for r in kept]
    assert history.count == 5000 and len(kept) <= 10 * 2 + 21 + 2 * 2 * 10 + 2
    assert steps[:10] == list(range(10)) and steps[-10:] == list(range(4990, 5000))
    for event in (1200, 3000):  # the first skipped update and the first non-finite step, with their neighbours
        assert set(range(event - 10, event + 11)) <= set(steps), event
    sampled = [s for s in steps if 1210 < s < 2990]
    assert len(sampled) >= 5 and len(set(np.diff(sampled))) == 1  # an even stride
    # Each kept row is handed out (to the trace) once; so are sampled rows the sample later thinned out.
    handed = [r.step for r in written]
    assert len(handed) == len(set(handed)) and set(steps) <= set(handed) and len(handed) < 200

    np.testing.assert_array_equal(history.steps(), np.arange(5000))
    np.testing.assert_allclose(history.column("loss"), [r.loss for r in every], rtol=1e-7)
    for index, aggregate in enumerate(history.layers):
        assert aggregate.max_abs == max(r.layers[index].max_abs for r in every)
        assert aggregate.last == every[-1].layers[index]
        bad = [r.step for r in every if r.layers[index].nonfinite]
        assert (aggregate.nonfinite_steps, aggregate.first_nonfinite_step, aggregate.last_nonfinite_step) == (
            len(bad), bad[0] if bad else None, bad[-1] if bad else None)
    for index, aggregate in enumerate(history.variables):
        assert aggregate.max_grad_norm == max(r.variables[index].grad_norm for r in every)
        assert aggregate.min_grad_norm == min(r.variables[index].grad_norm for r in every)
        assert aggregate.max_update_ratio == max(r.variables[index].update_ratio for r in every[1:])
        assert aggregate.nonfinite_steps == (2000 if index == 2 else 0)
    assert history.series.nbytes < 2 * 80 * 5000  # a few dozen bytes a step, blocks at most twice the rows


def test_a_short_run_keeps_every_row():
    history = StepHistory(layers=3, variables=4, keep=10, sample=20)
    for record in synthetic_records(25):
        history.add(record)
    assert [r.step for r in history.kept()] == list(range(25))
    assert history.sampling_note() == "all 25 steps are kept"


def anonymous(value, report):
    """`value` as JSON text with the report's layer names replaced by their index (a second model built in one
    process gets other names)."""
    text = json.dumps(value, default=lambda o: vars(o), sort_keys=True)
    names = sorted(((name, i) for i, (name, _) in enumerate(report.layers)), key=lambda pair: -len(pair[0]))
    for name, index in names:
        text = text.replace(f'"{name}', f'"<layer {index}>').replace(f" {name} ", f" <layer {index}> ")
    return re.sub(r"forensic replay of step (\d+): [0-9.]+ s", r"forensic replay of step \1", text)


def findings(report):
    return anonymous([(r.id, r.severity, r.evidence, r.data) for r in report.recommendations], report)


def tables(document, report):
    keys = ("status", "steps_run", "first_nonfinite", "layers", "variables", "outputs", "recommendations")
    return anonymous({key: document[key] for key in keys}, report)


# exploding: the gradient norm grows until step 7's forward pass overflows; exp-overflow: exp(x) overflows from
# step 0 (kept going); healthy: nothing fires.
EXPECTED_FINDINGS = {"exploding": ["clip-gradients", "lower-learning-rate", "normalize-targets", "bounded-activation"],
                     "exp-overflow": ["stable-exp"], "healthy": []}


@pytest.mark.parametrize("name, keep_going", [("exploding", False), ("exp-overflow", True), ("healthy", False)])
def test_a_bounded_run_gives_the_findings_of_a_run_kept_in_full(name, keep_going, tmp_path):
    spec = apply_overrides(load_spec(SPECS / f"{name}.yaml"), steps=40)
    full = run_trace(spec, TraceOptions(trace_path=tmp_path / "full.jsonl", keep_steps=10_000, trace_full=True,
                                        keep_going=keep_going))
    bounded = run_trace(spec, TraceOptions(trace_path=tmp_path / "kept.jsonl", keep_steps=1, sample_steps=2,
                                           keep_going=keep_going))
    assert bounded.steps_run == full.steps_run >= 8
    assert len(bounded.records) < full.steps_run == len(full.records)
    assert findings(bounded) == findings(full)
    # What each run is known to show over its 40 steps, so equal findings cannot be two empty lists.
    assert [r.id for r in full.recommendations] == EXPECTED_FINDINGS[name]
    assert tables(bounded.to_json(), bounded) == tables(full.to_json(), full)

    # The report redrawn from either trace is the report of the run.
    for path, report in ((tmp_path / "full.jsonl", full), (tmp_path / "kept.jsonl", bounded)):
        redrawn = json.loads(json.dumps(load_trace(path).to_json()))
        document = json.loads(json.dumps(report.to_json()))
        assert tables(redrawn, report) == tables(document, report)
        assert redrawn["steps"] == document["steps"] and redrawn["steps_total"] == report.steps_run


def test_the_default_trace_holds_every_steps_scalars_and_the_kept_rows(tmp_path):
    trace = tmp_path / "t.jsonl"
    report = run_trace(load_spec(SPECS / "healthy.yaml"), TraceOptions(trace_path=trace, keep_steps=3, sample_steps=4))
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    header, kinds = lines[0], [line["kind"] for line in lines]
    assert header["rows"] == "kept" and header["series"][:3] == ["step", "batch_rows", "phase"]
    scalar_rows = [row for line in lines if line["kind"] == "scalars" for row in line["rows"]]
    assert [row[0] for row in scalar_rows] == list(range(30))
    loss = header["series"].index("loss")
    assert [row[loss] for row in scalar_rows] == pytest.approx([float(v) for v in report.history.column("loss")])
    full_steps = [line["step"] for line in lines if line["kind"] == "step"]
    # The kept rows, each once, and sampled rows that the sample thinned out later.
    assert set(r.step for r in report.records) <= set(full_steps) and len(set(full_steps)) == len(full_steps) < 30
    assert kinds[-2:] == ["aggregates", "summary"]

    document = report.to_json()
    assert document["steps_total"] == 30 and len(document["steps"]) == len(report.records) < 30
    assert "every layer and variable" in document["steps_sampling"]


def test_a_trace_cut_short_redraws_from_its_scalars_with_a_note(tmp_path):
    trace = tmp_path / "t.jsonl"
    run_trace(load_spec(SPECS / "healthy.yaml"), TraceOptions(trace_path=trace, keep_steps=3, sample_steps=4))
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(line for line in lines if '"kind": "aggregates"' not in line
                               and '"kind": "summary"' not in line) + "\n")
    report = load_trace(trace)
    assert report.steps_run == 30 and report.interrupted
    assert any("aggregates" in note for note in report.notes)
    assert report.layer_summaries()[0]["max_abs"] > 0


def test_a_bad_scalars_row_is_one_clear_error(tmp_path):
    trace = tmp_path / "t.jsonl"
    run_trace(load_spec(SPECS / "healthy.yaml"), TraceOptions(trace_path=trace, keep_steps=3, sample_steps=4))
    lines = trace.read_text().splitlines()
    number = next(i for i, line in enumerate(lines) if '"kind":"scalars"' in line)
    lines[number] = '{"kind":"scalars","rows":[[1,2]]}'
    trace.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["report", str(trace)])
    assert result.exit_code == 2 and f"line {number + 1}" in result.stderr and "Traceback" not in result.stderr


def test_a_trace_with_other_scalar_columns_is_read_by_name(tmp_path):
    trace = tmp_path / "t.jsonl"
    report = run_trace(load_spec(SPECS / "healthy.yaml"), TraceOptions(trace_path=trace, keep_steps=3, sample_steps=4))
    lines = [json.loads(line) for line in trace.read_text().splitlines()]
    dropped = lines[0]["series"].index("update_ratio")  # as if written before that column existed
    lines[0]["series"].pop(dropped)
    lines[0]["series"] = [*lines[0]["series"][:2], *reversed(lines[0]["series"][2:])]  # and in another order
    for line in lines:
        if line["kind"] == "scalars":
            line["rows"] = [[*row[:2], *reversed(row[2:dropped] + row[dropped + 1:])] for row in line["rows"]]
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    redrawn = load_trace(trace)
    np.testing.assert_array_equal(redrawn.history.column("loss"), report.history.column("loss"))
    assert not redrawn.history.column("update_ratio").any()
    lines[0]["series"] = "loss"
    trace.write_text("".join(json.dumps(line) + "\n" for line in lines))
    result = CliRunner().invoke(app, ["report", str(trace)])
    assert result.exit_code == 2 and "line 1: series" in result.stderr


def test_keep_steps_must_be_positive(tmp_path):
    result = CliRunner().invoke(app, ["trace-steps", str(SPECS / "healthy.yaml"), "--keep-steps", "0"])
    assert result.exit_code == 2


def test_the_callback_keeps_a_bounded_history(tmp_path):
    from nanscope.keras import NanScope
    from nanscope.runtime import tensorflow

    _, keras = tensorflow()
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse", steps_per_execution=8)
    x = np.random.default_rng(0).standard_normal((640, 4)).astype("float32")
    scope = NanScope(verbose=0, trace=tmp_path / "t.jsonl", keep_steps=4, sample_steps=4)
    model.fit(x, x[:, :1], batch_size=8, epochs=2, shuffle=False, callbacks=[scope], verbose=0)
    report = scope.report
    assert report.steps_run == 160 and len(report.records) <= 4 + 4 + 5
    np.testing.assert_array_equal(report.history.steps(), np.arange(160))
    redrawn = load_trace(tmp_path / "t.jsonl")
    assert redrawn.steps_run == 160 and redrawn.layer_summaries() == report.layer_summaries()
    assert all(math.isfinite(v) for v in redrawn.history.column("loss"))
    with pytest.raises(ValueError, match="keep_steps"):
        NanScope(keep_steps=0)


def test_norms_past_the_square_root_of_the_float64_max_are_capped_not_raised():
    """Weight norms of 2e154 (a float64 model's, or a float32 norm times a huge update ratio): their squares
    overflow a Python float, and `sqrt(sum(x ** 2))` raised OverflowError inside the user's training."""
    from nanscope.engine.records import StepRecord, VariableStats
    from nanscope.store.rows import FLOAT32_MAX, global_update_ratio, scalar_row, series_columns

    variables = [VariableStats(grad_norm=1.0, grad_nonfinite=0, weight_norm=2e154, update_ratio=0.5,
                               weight_nonfinite=0) for _ in range(2)]
    record = StepRecord(step=0, batch_rows=8, loss=1.0, data_loss=1.0, grad_global_norm=1.0,
                        applied_grad_global_norm=1.0, x_nonfinite=0, y_nonfinite=0, output_nonfinite=0,
                        loss_nonfinite=False, grad_nonfinite=0, weights_nonfinite=0, variables=variables)
    assert global_update_ratio(record) == pytest.approx(0.5, rel=1e-12)
    row = series_columns(0).named(scalar_row(record))
    assert row["weight_norm"] == float(np.float32(FLOAT32_MAX))
    assert row["update_ratio"] == 0.5
