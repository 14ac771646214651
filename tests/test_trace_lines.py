"""The trace's line kinds (nanscope/store/lines.py): each one reads back from its JSON as it was written."""

import json
import math

import pytest

from nanscope.engine.records import LayerStats, OutputStats, StepRecord, VariableStats
from nanscope.jsonio import dumps
from nanscope.store.aggregates import LayerAggregate, OutputAggregate, VariableAggregate
from nanscope.store.history import StepHistory
from nanscope.store.lines import (
    TRACE_SCHEMA, AggregatesLine, ErrorLine, HeaderLine, ScalarsLine, StepLine, SummaryLine, parse_line,
)


def through_json(line):
    return parse_line(json.loads(dumps(line.to_json(), indent=None)))


def record(step=4):
    return StepRecord(step=step, batch_rows=8, loss=math.inf, data_loss=math.nan, grad_global_norm=-math.inf,
                      applied_grad_global_norm=2.5, x_nonfinite=0, y_nonfinite=0, output_nonfinite=3,
                      loss_nonfinite=True, grad_nonfinite=7, weights_nonfinite=0,
                      layers=[LayerStats(1e38, 0.5, 3, None, 0.0, True, 0.25)],
                      variables=[VariableStats(math.nan, 7, 1.5, math.inf, 0)],
                      outputs=[OutputStats(-0.0, 0, 3)], loss_scale=128.0, update_skipped=True)


def test_a_step_line_reads_back_as_its_record_nan_and_inf_included():
    line = through_json(StepLine(record(), kept="event"))
    assert isinstance(line, StepLine) and line.kept == "event"
    got, want = line.record, record()
    assert (got.loss, got.grad_global_norm, got.step, got.phase) == (math.inf, -math.inf, 4, "forward")
    assert math.isnan(got.data_loss) and math.isnan(got.variables[0].grad_norm)
    assert got.variables[0].update_ratio == math.inf and got.layers == want.layers
    assert math.copysign(1.0, got.outputs[0].loss) == -1.0  # -0.0 keeps its sign


def test_the_header_of_a_kept_rows_trace_names_its_layout_and_reads_back_equal():
    history = StepHistory(layers=1, variables=1, keep=3, sample=4)
    header = HeaderLine.for_run({"run": {"spec": "s.yaml"}, "layers": [["dense", "Dense"]], "layer_order": [0],
                                 "variables": ["dense/kernel"]}, history)
    written = header.to_json()
    assert (written["kind"], written["schema"], written["rows"], written["keep"], written["sample"]) == (
        "header", TRACE_SCHEMA, "kept", 3, 4)
    assert written["series"][:3] == ["step", "batch_rows", "phase"]
    assert through_json(header) == header
    full = HeaderLine.for_run({"run": {}, "layers": [], "layer_order": [], "variables": []}, history, full=True)
    assert full.to_json()["rows"] == "full" and "series" not in full.to_json()


def test_a_header_from_another_version_keeps_what_it_knows_and_defaults_the_rest():
    header = parse_line({"kind": "header", "schema": "nanscope.trace-lines/9", "run": {"a": 1}, "future": [1, 2]})
    assert (header.schema, header.run, header.rows, header.layers) == ("nanscope.trace-lines/9", {"a": 1}, "full", [])


def test_scalars_error_and_summary_lines_read_back_equal():
    scalars = ScalarsLine([[0, 1.5, "nan"], [1, 2.0, "inf"]])
    back = through_json(scalars)
    assert back.rows[0][:2] == [0, 1.5] and back.rows[1][2] == "inf"
    assert ScalarsLine.text(["[0,1.5]", "[1,2]"]) == '{"kind":"scalars","rows":[[0,1.5],[1,2]]}'
    assert json.loads(ScalarsLine.text(["[0,1.5]"])) == {"kind": "scalars", "rows": [[0, 1.5]]}
    assert through_json(ErrorLine(7, "a collective failed")) == ErrorLine(7, "a collective failed")
    summary = SummaryLine(first_nonfinite={"step": 8, "phase": "loss"}, notes=["n"], stopped="stopped at 9",
                          run={"optimizer_config": {"learning_rate": 0.1}})
    assert through_json(summary) == summary
    assert "stopped" not in SummaryLine().to_json() and "run" not in SummaryLine().to_json()


def test_the_aggregates_line_reads_back_the_exact_aggregates():
    line = AggregatesLine([LayerAggregate(called_steps=3, max_abs=math.inf, last=LayerStats(1.0, 0.5, 0, 0.1, 0.0))],
                          [VariableAggregate(steps=3, max_grad_norm=2.0, last=VariableStats(1.0, 0, 2.0, 0.01, 0))],
                          [OutputAggregate(first=OutputStats(1.0, 0, 0), last=OutputStats(math.nan, 0, 1),
                                           nonfinite_steps=1)], 4)
    back = through_json(line)
    assert back.layers == line.layers and back.variables == line.variables and back.sample_stride == 4
    assert back.outputs[0].first == OutputStats(1.0, 0, 0) and math.isnan(back.outputs[0].last.loss)


@pytest.mark.parametrize("line", [{"kind": "future-kind", "x": 1}, {"no": "kind"}])
def test_a_line_of_a_kind_this_version_does_not_know_stays_a_dict(line):
    assert parse_line(line) == line
