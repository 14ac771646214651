"""The step row's layout and the record store, each against an exact value: the columns by name, the widths and
offsets of a step row, splitting and joining one, and what the bounded history and the series keep.

Plain arrays and hand-made records, no training (docs/mutation.md lists what each test here was written to
catch)."""

import math
import os

import numpy as np
import pytest

from boundary_runs import step
from nanscope.engine.records import OutputStats, expected_layer_indices, output_stats_of
from nanscope.engine.schema import LAYER, OUTPUT, SCALARS, VARIABLE, Columns, StepLayout, join, output_offsets
from nanscope.jsonio import new_file_mode, write_json, write_text_atomic
from nanscope.store.history import StepHistory
from nanscope.store.rows import series_columns
from nanscope.store.lines import ErrorLine, ScalarsLine
from nanscope.store.series import TraceColumns


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
