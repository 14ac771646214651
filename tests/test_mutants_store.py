"""The step row's layout and the record store, each against an exact value: the columns by name, the widths and
offsets of a step row, splitting and joining one, and what the bounded history and the series keep.

Plain arrays and hand-made records, no training (docs/mutation.md lists what each test here was written to
catch)."""

import dataclasses
import math
import os
import subprocess
import sys
import tempfile
import types

import numpy as np
import pytest

from boundary_runs import report_of, step
from nanscope.engine.records import (LayerStats, OutputStats, StepRecord, VariableStats, expected_layer_indices,
                                     first_nonfinite_replica, first_nonfinite_worker, layer_stats_of,
                                     output_stats_of, record_from_dict)
from nanscope.engine.schema import LAYER, OUTPUT, SCALARS, VARIABLE, Columns, StepLayout, join, output_offsets
from nanscope.jsonio import jsonable, new_file_mode, write_json, write_text_atomic
from nanscope.report.model import FirstNonfinite
from nanscope.store.aggregates import LayerAggregate, OutputAggregate, VariableAggregate
from nanscope.store.history import StepHistory
from nanscope.store.overview import OverviewFold, fold_overview
from nanscope.store.rows import global_update_ratio, overall_norms, scalar_row, series_columns
from nanscope.store.lines import AggregatesLine, ErrorLine, HeaderLine, ScalarsLine, SummaryLine
from nanscope.store.series import ScalarColumns, TraceColumns


def test_columns_are_found_by_name_and_packed_in_row_order():
    columns = Columns("a", "b", "c")
    assert [columns.at(name) for name in ("a", "b", "c")] == [0, 1, 2]
    assert columns.pack({"c": 3, "a": 1}, default=0) == [1, 0, 3]
    assert columns.pack({"c": 3, "a": 1, "b": 2}) == [1, 2, 3]
    assert columns.named([1, 2, 3]) == {"a": 1, "b": 2, "c": 3}
    with pytest.raises(KeyError, match=r"no column 'd'; the columns are a, b, c"):
        columns.at("d")
    with pytest.raises(KeyError, match=r"not columns: d, e; the columns are a, b, c"):
        columns.pack({"e": 1, "d": 2, "a": 0}, default=0)
    with pytest.raises(KeyError, match=r"no value for column\(s\) b, c"):
        columns.pack({"a": 1})
    with pytest.raises(ValueError, match=r"column names must be unique. Received: \('a', 'a'\)"):
        Columns("a", "a")


def test_a_step_layout_has_the_widths_of_its_parts():
    layout = StepLayout(outputs=2, layers=3, terms=4, variables=5)
    assert (len(SCALARS), len(OUTPUT), len(LAYER), len(VARIABLE)) == (14, 3, 6, 5)
    assert layout.scalar_width == 14 + 2 * 3
    assert layout.shapes == ([20], [3, 6], [4], [5, 5])
    assert layout.widths == [20, 18, 4, 25]
    assert layout.width == 67
    assert output_offsets("loss", 2) == [14, 17]
    assert output_offsets("prediction_nonfinite", 3) == [16, 19, 22]
    assert output_offsets("loss", 0) == []


def test_a_step_row_splits_back_into_its_parts_and_joins_again():
    layout = StepLayout(outputs=1, layers=2, terms=3, variables=1)
    rows = np.arange(2 * layout.width, dtype=np.float32).reshape(2, layout.width)  # two steps, one row each
    scalars, layers, terms, variables = layout.split(rows)
    assert scalars.shape == (2, 17) and layers.shape == (2, 2, 6) and terms.shape == (2, 3)
    assert variables.shape == (2, 1, 5)
    assert scalars[1, 0] == layout.width and layers[0, 1, 5] == 17 + 11 and terms[0].tolist() == [29.0, 30.0, 31.0]
    assert variables[1].tolist() == [[layout.width + 32.0 + i for i in range(5)]]
    assert np.array_equal(np.asarray(join(layout.split(rows[0]))), rows[0])
    with pytest.raises(ValueError, match=r"a step row has 37 columns for this layout. Received: 36"):
        layout.split(rows[:, :-1])
    with pytest.raises(ValueError, match=r"a step row has 37 columns for this layout. Received: 36"):
        layout.split(rows[:, :-1].reshape(2, 1, 36))  # the last axis counts, however many lead it


def test_the_history_finds_a_kept_row_at_the_start_in_the_sample_around_an_event_and_at_the_end():
    history = StepHistory(2, 1, keep=2, sample=2)
    for number in range(40):
        history.add(step(number, loss=1e6 if number == 20 else 1.0))  # step 20's loss spikes: an event
    assert [r.step for r in history.kept()] == [0, 1, 16, 18, 19, 20, 21, 22, 32, 38, 39]
    for number in (0, 1, 16, 20, 22, 32, 39):
        assert history.record_at(number).step == number
    for number in (2, 30, 40):
        assert history.record_at(number) is None


def test_a_trace_columns_row_appended_is_counted_and_folded():
    columns = series_columns(0)
    appended = TraceColumns("unused.jsonl", columns, rows=None, lines=None)
    extended = TraceColumns("unused.jsonl", columns, rows=None, lines=None)
    row = np.arange(len(columns), dtype=np.float32)
    for number in range(3):
        appended.append(number, row + number)
    extended.extend(np.arange(3, dtype=np.int64), np.stack([row + n for n in range(3)]))
    assert appended.count == extended.count == 3
    assert appended.overview() == extended.overview()


def test_an_output_row_and_the_expected_layers_are_read_by_name():
    assert output_stats_of({"loss": 2.5, "target_nonfinite": 3.0, "prediction_nonfinite": 1.0}) == OutputStats(
        2.5, 3, 1)
    names = ["attn1/mask", "attn1/dense", "head", "Head"]
    assert expected_layer_indices(["attn*/mask", "head"], names) == [0, 2]  # case matters
    assert expected_layer_indices(None, names) == []


def test_write_json_writes_the_encoded_value_atomically_with_an_ordinary_files_mode(tmp_path, capsys):
    target = tmp_path / "new" / "report.json"  # its folder does not exist yet
    write_json(target, {"loss": math.nan, "rows": (1, 2)})
    assert target.read_text() == '{\n  "loss": "nan",\n  "rows": [\n    1,\n    2\n  ]\n}\n'
    assert target.stat().st_mode & 0o777 == new_file_mode()
    assert sorted(p.name for p in target.parent.iterdir()) == ["report.json"]  # no temporary file left
    write_json("-", [math.inf])
    assert capsys.readouterr().out == '[\n  "inf"\n]\n'
    umask = os.umask(0o027)
    try:
        assert new_file_mode() == 0o640
    finally:
        os.umask(umask)


def test_a_write_that_fails_leaves_the_old_file_and_no_temporary_one(tmp_path):
    target = tmp_path / "report.json"
    write_text_atomic(target, "old\n")
    with pytest.raises(TypeError):
        write_text_atomic(target, b"not text")  # type: ignore[arg-type]
    assert target.read_text() == "old\n" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_a_scalars_line_keeps_integers_and_spells_non_finite_floats_and_an_error_line_defaults_its_message():
    encoded = ScalarsLine([[3, math.nan, np.float32(2.5), -math.inf]]).to_json()
    assert encoded == {"kind": "scalars", "rows": [[3, "nan", 2.5, "-inf"]]}
    assert [type(v) for v in encoded["rows"][0]] == [int, str, float, str]  # the step stays an int: "3", not "3.0"
    assert ScalarsLine.from_json({"kind": "scalars"}).rows == []
    assert ErrorLine.from_json({"kind": "error", "step": 7}) == ErrorLine(7, "")


def test_a_layer_aggregate_folds_the_called_steps_extremes_the_healthy_peak_and_the_nonfinite_steps():
    aggregate = LayerAggregate()
    steps = [  # step, max |x|, non-finite, zero fraction, called, underflow fraction, healthy
        (0, 3.0, 0, 0.5, True, 0.1, True),
        (1, 100.0, 0, 0.9, False, 0.9, True),  # not called: none of its values counts
        (2, 1.0, 2, None, True, 0.05, False),
        (3, 5.0, 0, 0.25, True, 0.2, False),  # the largest peak, on a step that is not healthy
        (4, 4.0, 0, None, True, 0.0, True),
        (5, 2.0, 3, None, True, 0.0, True),
    ]
    stats = {}
    for number, peak, nonfinite, zeros, called, underflow, healthy in steps:
        stats[number] = LayerStats(peak, peak / 2, nonfinite, zeros, 0.0, called=called, underflow_fraction=underflow)
        aggregate.add(number, stats[number], healthy)
    assert aggregate == LayerAggregate(called_steps=5, max_abs=5.0, min_abs=1.0, max_abs_healthy=4.0,
                                       underflow_max=0.2, last=stats[5], zero_fraction_last=0.25, nonfinite_steps=2,
                                       first_nonfinite_step=2, last_nonfinite_step=5)
    assert aggregate.last is stats[5]


def test_a_variable_aggregate_keeps_finite_extremes_the_first_ratio_apart_and_skips_absorbed_gradients():
    aggregate = VariableAggregate()
    rows = {  # step: grad norm, non-finite gradient entries, update ratio, non-finite weights, absorbed
        0: (2.0, 0, 0.5, 0, False),  # the first step's ratio is kept apart from the largest after it
        1: (math.inf, 3, math.nan, 0, None),  # non-finite gradients, `absorbed` left to its default
        2: (5.0, 0, 0.01, 0, False),
        3: (1.0, 2, 0.03, 0, True),  # non-finite gradients of a skipped update: loss scaling at work
        4: (3.0, 0, 0.02, 1, True),  # non-finite weights count even then
        5: (4.0, 0, math.nan, 0, False),
    }
    stats = {}
    for number, (grad, grad_nonfinite, ratio, weight_nonfinite, absorbed) in rows.items():
        stats[number] = VariableStats(grad, grad_nonfinite, 1.0, ratio, weight_nonfinite)
        if absorbed is None:
            aggregate.add(number, stats[number])
        else:
            aggregate.add(number, stats[number], absorbed)
    assert aggregate == VariableAggregate(steps=6, max_grad_norm=5.0, min_grad_norm=1.0, first_update_ratio=0.5,
                                          max_update_ratio_after_first=0.03, last=stats[5], nonfinite_steps=2,
                                          first_nonfinite_step=1, last_nonfinite_step=4)
    assert aggregate.last is stats[5] and aggregate.max_update_ratio == 0.03
    one_step = VariableAggregate()
    one_step.add(7, VariableStats(1.0, 0, 1.0, 0.25, 0))
    assert (one_step.first_update_ratio, one_step.max_update_ratio_after_first, one_step.max_update_ratio) == (
        0.25, None, 0.25)


def test_an_output_aggregate_keeps_its_first_and_last_rows_the_finite_loss_range_and_every_nonfinite_step():
    aggregate = OutputAggregate()
    rows = {  # step: loss, non-finite targets, non-finite predictions
        0: (2.0, 0, 0), 1: (5.0, 0, 0), 2: (math.nan, 0, 0), 3: (1.0, 2, 0), 4: (3.0, 0, 1), 5: (4.0, 0, 0)}
    stats = {number: OutputStats(*row) for number, row in rows.items()}
    for number, row in stats.items():
        aggregate.add(number, row)
    assert aggregate.first is stats[0] and aggregate.last is stats[5]
    assert (aggregate.max_loss, aggregate.min_loss) == (5.0, 1.0)
    assert (aggregate.nonfinite_steps, aggregate.first_nonfinite_step, aggregate.last_nonfinite_step) == (3, 2, 4)


def _record(number, layers, variables, outputs, **fields):
    """A StepRecord of `number` with the given layer, variable and output rows and every scalar finite."""
    scalars = {"step": number, "batch_rows": 8, "loss": 1.0, "data_loss": 1.0, "grad_global_norm": 1.0,
               "applied_grad_global_norm": 1.0, "x_nonfinite": 0, "y_nonfinite": 0, "output_nonfinite": 0,
               "loss_nonfinite": False, "grad_nonfinite": 0, "weights_nonfinite": 0}
    return StepRecord(**{**scalars, **fields}, layers=layers, variables=variables, outputs=outputs)


def test_the_history_folds_each_row_into_its_aggregate_with_the_steps_health_and_absorption():
    def layer(peak, nonfinite=0, called=True):
        return LayerStats(peak, peak / 2, nonfinite, None, 0.0, called=called)

    records = [
        _record(0, [layer(0.1), layer(2.0, called=False)], [VariableStats(1.5, 0, 1.0, 0.01, 0)],
                [OutputStats(0.5, 0, 0)]),
        # a skipped update whose gradients overflowed: healthy, and its gradients absorbed
        _record(1, [layer(3.0), layer(1.0)], [VariableStats(math.inf, 4, 1.0, 0.02, 0)], [OutputStats(0.4, 0, 0)],
                update_skipped=True, grad_nonfinite=4),
        _record(2, [layer(7.0), layer(0.5, nonfinite=3)], [VariableStats(math.inf, 2, 1.0, 0.03, 0)],
                [OutputStats(math.nan, 0, 0)], grad_nonfinite=2),  # forward: not healthy
        _record(3, [layer(0.25), layer(4.0)], [VariableStats(2.5, 0, 1.0, 0.04, 0)], [OutputStats(0.3, 0, 0)]),
        # skipped once the scale collapsed: not healthy, and its gradients count
        _record(4, [layer(0.5), layer(0.5)], [VariableStats(math.inf, 5, 1.0, 0.05, 0)], [OutputStats(0.2, 0, 0)],
                update_skipped=True, scale_collapsed=True, grad_nonfinite=5),
    ]
    assert [r.phase for r in records] == [None, None, "forward", None, "backward"]
    history = StepHistory(2, 1, outputs=1)
    layers, variables, outputs = [LayerAggregate(), LayerAggregate()], [VariableAggregate()], [OutputAggregate()]
    for record, healthy, absorbed in zip(records, (True, True, False, True, False), (False, True, False, False, False)):
        history.add(record)
        for aggregate, stats in zip(layers, record.layers):
            aggregate.add(record.step, stats, healthy)
        variables[0].add(record.step, record.variables[0], absorbed)
        outputs[0].add(record.step, record.outputs[0])
    assert (history.layers, history.variables, history.outputs) == (layers, variables, outputs)
    assert (history.layers[0].max_abs, history.layers[0].max_abs_healthy) == (7.0, 3.0)
    assert (history.layers[1].nonfinite_steps, history.layers[1].first_nonfinite_step) == (1, 2)
    assert (history.variables[0].nonfinite_steps, history.variables[0].first_nonfinite_step,
            history.variables[0].last_nonfinite_step) == (2, 2, 4)
    assert (history.outputs[0].nonfinite_steps, history.outputs[0].first_nonfinite_step) == (1, 2)
    steps, values = history.layer_trend(0)  # the healthy steps only, each value as float32 keeps it
    assert steps.dtype == np.int64 and values.dtype == np.float64
    assert steps.tolist() == [0, 1, 3] and values.tolist() == [float(np.float32(v)) for v in (0.1, 3.0, 0.25)]
    steps, values = history.layer_trend(1)  # not called on step 0
    assert steps.tolist() == [1, 3] and values.tolist() == [1.0, 4.0]


def test_the_layer_trend_keeps_the_last_1024_healthy_steps_in_step_order():
    history = StepHistory(2, 1, keep=1, sample=2)
    for number in range(1030):
        history.add(step(number, layer_max=(number + 1.0, 1.0)))
    steps, values = history.layer_trend(0)
    assert np.array_equal(steps, np.arange(6, 1030)) and np.array_equal(values, np.arange(7.0, 1031.0))


def test_the_history_keeps_each_row_for_its_reason_and_hands_out_the_rows_kept_for_good():
    history = StepHistory(2, 1, keep=2, sample=4)
    assert (history.sample_stride, history.first_nonfinite_step, history.first_skipped_step,
            history.first_spike_step, history.first_bound_step) == (1, None, None, None, None)
    handed = {}
    for number in range(40):
        record = step(number, skipped=number == 10, loss_nonfinite=number == 20,
                      layer_max=(1e20 if number == 30 else 1.0, 1.0), loss=1000.0 if number == 35 else 1.0)
        handed[number] = [r.step for r in history.add(record)]
    # the first skipped update, the first non-finite step, the first layer past float32's bound, the first spike
    assert (history.first_skipped_step, history.first_nonfinite_step, history.first_bound_step,
            history.first_spike_step) == (10, 20, 30, 35)
    why = {"head": [0, 1], "sample": [2, 3, 4, 5, 6, 8, 16, 24],
           "event": [9, 10, 11, 12, 18, 19, 20, 21, 22, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37]}
    for reason, numbers in why.items():
        assert [n for n in range(40) if history.why_kept(n) == reason] == numbers
    assert [n for n in range(40) if history.why_kept(n) == "last"] == [
        7, 13, 14, 15, 17, 23, 25, 26, 27, 38, 39]  # 14 and 28 made the stride double without entering the sample
    assert {n: h for n, h in handed.items() if h != [n]} == {
        7: [], 9: [], 10: [9, 10], 13: [], 14: [], 15: [], 17: [], 18: [], 19: [], 20: [18, 19, 20], 23: [], 25: [],
        26: [], 27: [], 28: [], 29: [], 30: [28, 29, 30], 33: [], 34: [], 35: [33, 34, 35], 38: [], 39: []}
    assert history.sample_stride == 8
    assert [r.step for r in history.kept()] == [0, 1, 8, 9, 10, 11, 12, 16, *range(18, 23), 24, *range(28, 40)]
    assert [r.step for r in history.unwritten()] == [38, 39]


def test_a_history_of_one_kept_row_samples_from_the_second_step():
    history = StepHistory(1, 1, keep=1, sample=4)
    for number in range(3):
        history.add(step(number))
    assert [history.why_kept(n) for n in range(3)] == ["head", "sample", "sample"]


def test_the_history_rejects_a_keep_below_one_or_a_sample_below_two():
    for keep, sample in ((0, 2), (1, 1)):
        with pytest.raises(ValueError, match=rf"^`keep` must be >= 1 and `sample` >= 2. Received: keep={keep}, "
                                             rf"sample={sample}$"):
            StepHistory(1, 1, keep=keep, sample=sample)


def test_rows_read_back_are_kept_by_why_the_run_kept_them_and_thinned_to_the_runs_stride():
    history = StepHistory(2, 1, keep=2, sample=4)
    whys = {0: "head", 1: "head", 4: "sample", 6: "sample", 9: "event", 10: "event", 12: "sample", 14: "last",
            15: "last"}
    for number, why in whys.items():
        history.keep_read_row(step(number), why)
    history.thin_sample(None)  # a trace without the stride: nothing to thin
    assert history.sample_stride == 1
    history.thin_sample(4)
    assert history.sample_stride == 4
    assert [r.step for r in history.kept()] == [0, 1, 4, 9, 10, 12, 14, 15]  # 6 is not on the stride of 4
    assert history.record_at(6) is None and history.record_at(4).step == 4


def test_a_loss_spike_is_past_100_times_the_median_of_the_20_finite_losses_before_it():
    def first_spike(losses):
        history = StepHistory(2, 1, keep=1, sample=2)
        for number, loss in enumerate(losses):
            history.add(step(number, loss=loss))
        return history.first_spike_step

    # past 100 times the smallest (5), at 100 times the median (10): not past it
    assert first_spike([5.0] + [10.0] * 19 + [1000.0]) is None
    assert first_spike([5.0] + [10.0] * 19 + [float(np.nextafter(1000.0, math.inf))]) == 20
    assert first_spike([10.0] * 19 + [0.01, 500.0]) is None  # past 100 times the smallest, not the median
    assert first_spike([0.0] * 20 + [1.0]) is None  # a median of 0: no spike
    assert first_spike([1.0] * 30 + [10.0] * 20 + [150.0]) is None  # only the last 20 count
    assert first_spike([1.0] * 5 + [math.nan, 1.0]) is None  # a non-finite loss is no spike


def test_a_layer_past_its_dtypes_bound_is_an_event_and_a_layer_not_told_of_gets_float32s():
    def first_bound(peaks, dtypes, layers=1):
        history = StepHistory(layers, 1, keep=1, sample=2, layer_dtypes=dtypes)
        for number, peak in enumerate(peaks):
            history.add(step(number, layer_max=peak))
        return history.first_bound_step

    bound16 = float(np.finfo(np.float16).max) / 100
    assert first_bound([(1.0, 1.0), (bound16, 1.0)], ["float16"]) is None  # at the bound: not past it
    assert first_bound([(1.0, 1.0), (float(np.nextafter(bound16, math.inf)), 1.0)], ["float16"]) == 1
    assert first_bound([(1.0, 1.0), (700.0, 1.0)], None) is None  # float32's bound without dtypes
    assert first_bound([(1.0, 1.0), (1.0, 700.0)], ["float16"]) is None  # the second layer, not told of
    assert first_bound([(1.0, 1.0), (1.0, 1e20)], ["float16"]) == 1
    assert first_bound([(1.0, 1.0), (700.0, 1.0), (1.0, 1e20)], ["float16"]) == 1


def test_the_healthy_steps_are_those_of_phase_0_with_their_scalars_and_kept_rows():
    history = StepHistory(2, 1, keep=1, sample=2)
    for number in range(6):  # step 2's loss and step 4's gradients are not finite
        history.add(step(number, loss=number + 0.5, grad=2.0 * number + 1, update_ratio=0.25 * (number + 1),
                         weight_norm=4.0 + number, loss_nonfinite=number == 2, grad_nonfinite=3 if number == 4 else 0))
    phases = history.phases()
    assert phases.dtype == np.int64 and phases.tolist() == [0, 0, 3, 0, 4, 0]  # PHASES: 3 loss, 4 backward
    healthy = history.healthy()
    assert healthy.steps.tolist() == [0, 1, 3, 5] and healthy.loss.tolist() == [0.5, 1.5, 3.5, 5.5]
    assert healthy.grad_norm.tolist() == [1.0, 3.0, 7.0, 11.0]
    assert healthy.update_ratio.tolist() == [0.25, 0.5, 1.0, 1.5] and healthy.weight_norm.tolist() == [4, 5, 7, 9]
    assert [r.step for r in history.kept()] == [0, 2, 3, 4, 5] and [r.step for r in healthy.records] == [0, 3, 5]
    assert history.sampling_note() == (
        "5 of 6 steps are kept with every layer and variable: the first 1, the last 1, every 2th step in between "
        "and the 1 steps before and after the first non-finite step, the first skipped update, the first loss spike "
        "and the first layer output past its dtype's activation bound; every step's scalars are kept, and the layer, "
        "variable and output tables are exact over all steps")
    short = StepHistory(2, 1)
    short.add(step(0))
    assert short.sampling_note() == "all 1 steps are kept"


def test_the_overview_is_cached_per_step_count_and_width():
    history = StepHistory(2, 1, keep=1, sample=2)
    for number in range(100):
        history.add(step(number, loss=1.0 + number))
    first = history.overview()
    assert history.overview() is first and first == history.series.overview()
    narrow = history.overview(4)
    assert narrow == history.series.overview(4) and narrow != first
    history.add(step(100, loss=0.5))
    assert history.overview() is not first and history.overview().steps == 101


def _rows(count, start=0):
    """`count` SERIES rows of steps `start`.., each value its step plus its column index over 8 (exact in float32)."""
    width = len(series_columns(0))
    steps = np.arange(start, start + count, dtype=np.int64)
    return steps, (steps[:, None] + np.arange(width) / 8).astype(np.float32)


def test_scalar_columns_hold_int64_steps_and_every_block_of_rows_in_order():
    columns = ScalarColumns(series_columns(0))
    assert columns.steps().dtype == np.int64 and columns.steps().size == 0 and columns.column("loss").size == 0
    steps, values = _rows(1500)  # past the first block of 1024 rows
    for number, row in zip(steps, values):
        columns.append(int(number), row.tolist())
    assert columns.count == 1500 and columns.steps().dtype == np.int64
    assert np.array_equal(columns.steps(), steps)
    loss = series_columns(0).at("loss")
    assert np.array_equal(columns.column("loss"), values[:, loss].astype(np.float64))
    assert columns.overview(4) == fold_overview(columns, 4) and columns.overview(4) != columns.overview()


def test_scalar_columns_of_only_some_columns_hold_those_by_name():
    columns = ScalarColumns(series_columns(0), only=["loss", "batch_rows"])
    steps, values = _rows(3)
    for number, row in zip(steps, values):
        columns.append(int(number), row.tolist())
    assert tuple(columns.columns) == ("loss", "batch_rows")
    assert columns.column("loss").tolist() == values[:, series_columns(0).at("loss")].tolist()
    assert columns.column("batch_rows").tolist() == [0.0, 1.0, 2.0]


class _Trace:
    """A trace's lines in memory, with the two callables TraceColumns reads them back by (the reader's own)."""

    def __init__(self, lines):
        self.lines, self.decoded = [{"kind": "header"}, *lines], []

    def stream(self, path):
        assert path == "run.jsonl"
        yield from enumerate(self.lines, start=1)

    def rows(self, path, number, line):
        self.decoded.append((path, number))
        if line["kind"] == "broken":
            raise ValueError(f"{path}:{number}: a line cut short")
        if line["kind"] != "rows":
            return None
        return _rows(line["count"], line["start"])


def _trace_columns(trace, counts):
    columns = TraceColumns("run.jsonl", series_columns(0), rows=trace.rows, lines=trace.stream)
    for count, start in counts:
        columns.extend(*_rows(count, start))
    return columns


def test_trace_columns_read_back_their_first_count_rows_line_by_line():
    lines = [{"kind": "rows", "count": 3, "start": 0}, {"kind": "note"}, {"kind": "rows", "count": 5, "start": 3},
             {"kind": "rows", "count": 4, "start": 8}, {"kind": "broken"}]  # the run goes on past what was added
    trace = _Trace(lines)
    columns = _trace_columns(trace, [(3, 0), (5, 3), (2, 8)])
    assert columns.count == 10
    assert np.array_equal(columns.steps(), np.arange(10)) and columns.steps().dtype == np.int64
    assert np.array_equal(columns.column("loss"), _rows(10)[1][:, series_columns(0).at("loss")].astype(np.float64))
    assert trace.decoded[:4] == [("run.jsonl", 2), ("run.jsonl", 3), ("run.jsonl", 4), ("run.jsonl", 5)]
    empty = _trace_columns(_Trace([]), [])
    assert empty.steps().dtype == np.int64 and empty.steps().size == 0


def test_trace_columns_read_back_in_chunks_of_1024_rows_and_fold_as_scalar_columns_do():
    for counts in ([(512, 0), (512, 512)], [(700, 0), (700, 700), (100, 1400)]):  # exactly one chunk; two and more
        trace = _Trace([{"kind": "rows", "count": count, "start": start} for count, start in counts])
        columns = _trace_columns(trace, counts)
        total = sum(count for count, _ in counts)
        assert np.array_equal(columns.steps(), np.arange(total))
        held = ScalarColumns(series_columns(0))
        for number, row in zip(*_rows(total)):
            held.append(int(number), row.tolist())
        assert columns.overview() == held.overview() and columns.overview(4) == held.overview(4)
        assert columns.overview(4) != columns.overview()


def test_a_trace_row_appended_is_kept_as_float32():
    columns = TraceColumns("run.jsonl", series_columns(0), rows=None, lines=None)
    row = [0.1] * len(series_columns(0))
    columns.append(0, row)
    columns.append(1, row)
    assert columns.overview().curves["loss"].last == float(np.float32(0.1))


def test_the_global_update_ratio_and_a_sentinel_steps_own_norms():
    def record(variables=(), overall=None, loss_scale=None):
        return _record(0, [], list(variables), [], overall_norms=overall, loss_scale=loss_scale,
                       loss_scale_before=loss_scale)

    half = [VariableStats(1.0, 0, 0.3, 0.5, 0), VariableStats(1.0, 0, 0.4, math.nan, 0)]  # |w| 0.5 in all
    assert global_update_ratio(record(half)) == 0.5 * 0.3 / 0.5
    assert global_update_ratio(record([VariableStats(1.0, 0, 0.0, 0.5, 0)])) == 0.0
    assert overall_norms(record(half)) == (0.5, 0.5 * 0.3 / 0.5)
    assert overall_norms(record(half, overall=(4.0, 1.0))) == (0.5, 0.5 * 0.3 / 0.5)  # the rows come first
    assert overall_norms(record(overall=(4.0, 1.0))) == (4.0, 0.25)
    assert overall_norms(record(overall=(0.5, 0.25))) == (0.5, 0.5)
    assert overall_norms(record(overall=(0.0, 1.0))) == (0.0, 0.0)
    assert overall_norms(record()) == (0.0, 0.0)
    values = series_columns(0).named(scalar_row(record(half)))
    assert (values["loss_scale"], values["loss_scale_before"]) == (0.0, 0.0)  # no loss scaling
    values = series_columns(0).named(scalar_row(record(half, loss_scale=8.0)))
    assert (values["loss_scale"], values["loss_scale_before"]) == (8.0, 8.0)


def test_a_new_files_mode_is_0666_less_the_umask():
    umask = os.umask(0o022)
    try:
        assert new_file_mode() == 0o644
        os.umask(0)
        assert new_file_mode() == 0o666
    finally:
        os.umask(umask)


def test_an_atomic_write_makes_its_folders_and_its_temporary_file_beside_the_target(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-folder"))  # the default folder is not used
    target = tmp_path / "a" / "b" / "report.json"
    write_text_atomic(target, "µ ∞\n")
    assert target.read_text(encoding="utf-8") == "µ ∞\n" and os.listdir(target.parent) == ["report.json"]


def test_the_overview_counts_the_steps_the_skipped_updates_and_the_steps_without_a_loss():
    records = [_record(n, [], [], [], update_skipped=n in (1, 4, 7), loss_missing=n in (2, 5),
                       loss=math.nan if n in (2, 5) else 1.0) for n in range(10)]
    names = [name for name in series_columns(0) if name != "loss_missing"]  # a trace from before the column
    columns, older = ScalarColumns(series_columns(0)), ScalarColumns(series_columns(0), only=names)
    for record in records:
        columns.append(record.step, scalar_row(record))
        older.append(record.step, scalar_row(record))
    overview = fold_overview(columns, 4)
    assert (overview.steps, overview.skipped_updates, overview.loss_missing) == (10, 3, 2)
    assert overview != fold_overview(columns)  # the width is the one asked for
    assert (fold_overview(older).steps, fold_overview(older).loss_missing) == (10, 0)


def test_the_summary_line_keeps_what_the_run_ended_with_and_reads_back_as_it_was_written():
    report = report_of([step(0)])
    report.interventions, report.spikes = [{"step": 3, "action": "skip"}], [{"step": 2, "metric": "loss"}]
    report.validation_loss, report.interrupted, report.notes, report.stopped = 0.5, True, ["a note"], "guard"
    schedule = {"class_name": "ExponentialDecay", "learning_rate_at_step": 0.05}
    report.run = {**report.run, "learning_rate_schedule": schedule}
    line = SummaryLine.of(report)
    assert line == SummaryLine(first_nonfinite=None, recommendations=[], interventions=report.interventions,
                               spikes=report.spikes, validation_loss=0.5, interrupted=True, notes=["a note"],
                               stopped="guard", run={"optimizer_config": report.run["optimizer_config"],
                                                     "learning_rate_schedule": schedule})
    encoded = line.to_json()
    assert encoded == {"kind": "summary", "first_nonfinite": None, "interventions": [{"step": 3, "action": "skip"}],
                       "spikes": [{"step": 2, "metric": "loss"}], "recommendations": [], "validation_loss": 0.5,
                       "interrupted": True, "notes": ["a note"], "stopped": "guard",
                       "run": {"optimizer_config": {"learning_rate": 0.01, "epsilon": 1e-7},
                               "learning_rate_schedule": schedule}}
    assert SummaryLine.from_json(encoded) == line
    bare = types.SimpleNamespace(first_nonfinite=None, recommendations=[], validation_loss=None, interrupted=False,
                                 notes=[], run=None)  # a report from before the guard's fields
    assert SummaryLine.of(bare) == SummaryLine()
    assert SummaryLine.of(bare).to_json() == {
        "kind": "summary", "first_nonfinite": None, "interventions": [], "spikes": [], "recommendations": [],
        "validation_loss": None, "interrupted": False, "notes": []}


def test_the_header_and_aggregates_lines_of_a_run_carry_its_layout_and_stride():
    history = StepHistory(2, 1, keep=1, sample=2)
    for number in range(5):
        history.add(step(number))
    header = HeaderLine.for_run({"run": {}, "layers": [["hidden", "Dense"]], "layer_order": ["hidden"],
                                 "variables": ["hidden/kernel"]}, history)
    assert (header.rows, header.series[:3], header.phases, header.keep, header.sample) == (
        "kept", ["step", "batch_rows", "phase"], [None, "data", "forward", "loss", "backward", "update"], 1, 2)
    line = AggregatesLine.of(history)
    assert history.sample_stride == 2 and line.sample_stride == 2 and line.to_json()["sample_stride"] == 2
    assert AggregatesLine.from_json({"kind": "aggregates"}) == AggregatesLine([], [], [], None)


def test_a_curve_starts_at_its_first_finite_value_or_else_at_its_first_value():
    def loss_curve(*blocks):
        fold, at, width = OverviewFold(series_columns(0), 4), series_columns(0).at("loss"), len(series_columns(0))
        start = 0
        for block in blocks:
            values = np.ones((len(block), width), np.float32)
            values[:, at] = block
            fold.add(np.arange(start, start + len(block), dtype=np.int64), values)
            start += len(block)
        return fold.overview().curves["loss"]

    curve = loss_curve([math.nan, 2.0, 3.0], [5.0])
    assert (curve.first_finite, curve.last) == (2.0, 5.0)
    curve = loss_curve([math.nan, math.inf], [-math.inf])  # never finite: the first value, the last value
    assert math.isnan(curve.first_finite) and curve.last == -math.inf
    curve = loss_curve([math.inf], [math.nan], [4.0])
    assert (curve.first_finite, curve.last) == (4.0, 4.0)


def test_a_record_is_read_from_the_step_functions_arrays_by_column_name():
    scalars = SCALARS.pack({"loss": 2.5, "data_loss": 2.0, "x_nonfinite": 1, "y_nonfinite": 2, "output_nonfinite": 3,
                            "loss_nonfinite": 1, "grad_global_norm": 4.0, "grad_nonfinite": 5, "weights_nonfinite": 6,
                            "applied_grad_global_norm": 3.5, "loss_scale": 4.0, "update_skipped": 1,
                            "loss_scale_before": 8.0, "loss_missing": 1})
    scalars += [0.5, 1, 0, math.nan, 0, 2]  # two outputs: loss, non-finite targets, non-finite predictions
    layers = [LAYER.pack({"max_abs": 6.0, "sum_abs": 8.0, "nonfinite": 1, "zeros": 2, "size": 4, "tiny": 1}),
              LAYER.pack({"max_abs": 0.0, "sum_abs": 0.0, "nonfinite": 0, "zeros": 0, "size": 0, "tiny": 0}),
              LAYER.pack({"max_abs": 3.0, "sum_abs": 2.0, "nonfinite": 0, "zeros": -1, "size": 8, "tiny": 0})]
    variables = [VARIABLE.pack({"grad_norm": 1.5, "grad_nonfinite": 2, "weight_norm": 4.0, "update_norm": 1.0,
                                "weight_nonfinite": 3}),
                 VARIABLE.pack({"grad_norm": 0.5, "grad_nonfinite": 0, "weight_norm": 0.0, "update_norm": 1.0,
                                "weight_nonfinite": 0}),
                 VARIABLE.pack({"grad_norm": 0.0, "grad_nonfinite": 0, "weight_norm": 0.0, "update_norm": 0.0,
                                "weight_nonfinite": 0})]
    record = StepRecord.from_arrays(7, 16, np.array(scalars), np.array(layers), [0.25, 0.0, 0.5, 0.125],
                                    np.array(variables))
    assert record == StepRecord(
        step=7, batch_rows=16, loss=2.5, data_loss=2.0, grad_global_norm=4.0, applied_grad_global_norm=3.5,
        x_nonfinite=1, y_nonfinite=2, output_nonfinite=3, loss_nonfinite=True, grad_nonfinite=5, weights_nonfinite=6,
        layers=[LayerStats(6.0, 2.0, 1, 0.5, 0.25, called=True, underflow_fraction=0.25),
                LayerStats(0.0, 0.0, 0, 0.0, 0.0, called=False, underflow_fraction=0.0),
                LayerStats(3.0, 0.25, 0, None, 0.5, called=True, underflow_fraction=0.0)],
        variables=[VariableStats(1.5, 2, 4.0, 0.25, 3), VariableStats(0.5, 0, 0.0, math.inf, 0),
                   VariableStats(0.0, 0, 0.0, 0.0, 0)],
        model_loss_term=0.125, loss_scale=4.0, update_skipped=True, loss_scale_before=8.0, loss_missing=True,
        outputs=[OutputStats(0.5, 1, 0), record.outputs[1]])
    assert math.isnan(record.outputs[1].loss) and (record.outputs[1].target_nonfinite,
                                                   record.outputs[1].prediction_nonfinite) == (0, 2)
    assert [type(v) for v in (record.batch_rows, record.x_nonfinite, record.layers[0].nonfinite)] == [int] * 3
    without_term = StepRecord.from_arrays(0, 1, np.array(SCALARS.pack({}, default=0.0)), np.array(layers[:1]),
                                          [0.25], np.zeros((0, len(VARIABLE))))
    assert without_term.model_loss_term == 0.0 and without_term.outputs == [] and without_term.loss_scale is None
    assert (without_term.loss_scale_before, without_term.update_skipped, without_term.loss_nonfinite) == (
        None, False, False)
    one = {"max_abs": 2.0, "sum_abs": 2.0, "nonfinite": 0, "zeros": 0, "size": 1, "tiny": 0}
    assert layer_stats_of(one, 0.0) == LayerStats(2.0, 2.0, 0, 0.0, 0.0, called=True)  # a one-element output


def test_the_first_nonfinite_output_replica_and_worker_of_a_record():
    outputs = [OutputStats(1.0, 0, 0), OutputStats(1.0, 2, 0), OutputStats(math.inf, 0, 3), OutputStats(math.nan, 1, 1)]
    record = _record(0, [], [], outputs, replica_nonfinite=[0, 0, 4, 1], worker_nonfinite=[0, 5])
    assert [record.nonfinite_output(phase) for phase in ("data", "forward", "loss", "backward", None)] == [
        1, 2, 2, None, None]
    assert (first_nonfinite_replica(record), first_nonfinite_worker(record)) == (2, 1)
    assert (first_nonfinite_replica(_record(0, [], [], [])), first_nonfinite_worker(_record(0, [], [], []))) == (
        None, None)
    masked = [LayerStats(1.0, 1.0, 0, None, 0.0), LayerStats(math.inf, 1.0, 4, None, 0.0)]
    assert _record(0, masked, [], [], output_nonfinite=2, expected_nonfinite=[1]).phase is None  # the mask's -inf
    assert _record(0, masked[:1], [], [], output_nonfinite=2, expected_nonfinite=[1]).phase == "forward"
    assert _record(0, [masked[0], LayerStats(1.0, 1.0, 0, None, 0.0)], [], [], output_nonfinite=2,
                   expected_nonfinite=[1]).phase == "forward"


def test_a_step_line_without_layer_variable_or_output_rows_reads_back_with_none():
    record = step(3, loss=math.inf)
    rows = ("layers", "variables", "outputs")
    line = {"kind": "step", **{k: v for k, v in jsonable(record).items() if k not in rows}}
    assert line["loss"] == "inf"
    assert record_from_dict(line) == dataclasses.replace(record, layers=[], variables=[], outputs=[])


def test_an_atomic_write_writes_utf8_in_any_locale(tmp_path):
    # In the C locale with UTF-8 mode off, Python's default text encoding is ASCII: the file's encoding is the
    # writer's, not the locale's. The child imports nanscope from where this process did (mutmut's copy included).
    import nanscope

    target = tmp_path / "report.json"
    package_root = os.path.dirname(os.path.dirname(nanscope.__file__))
    env = {**os.environ, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONPATH": package_root}
    code = ("import sys; from nanscope.jsonio import write_text_atomic; "
            "write_text_atomic(sys.argv[1], '\\u00b5 \\u221e\\n')")
    subprocess.run([sys.executable, "-c", code, str(target)], env=env, check=True, capture_output=True, timeout=60)
    here = tmp_path / "here.json"  # and in this process (mutmut maps a test to the functions it calls itself)
    write_text_atomic(here, "\u00b5 \u221e\n")
    assert target.read_bytes() == here.read_bytes() == b"\xc2\xb5 \xe2\x88\x9e\n"  # UTF-8


def test_a_field_marked_omitted_when_none_is_left_out_while_none_and_written_once_set():
    first = FirstNonfinite(step=3, phase="forward")
    plain = jsonable(first)
    assert "reproducible_replicas" not in plain and "origin_replicas" not in plain
    assert plain["reproducible"] is None and plain["origin"] is None  # unmarked fields are written as null
    first.reproducible_replicas = [0, 1]
    assert jsonable(first)["reproducible_replicas"] == [0, 1] and "origin_replicas" not in jsonable(first)
