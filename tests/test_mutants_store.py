"""The step row's layout and the record store, each against an exact value: the columns by name, the widths and
offsets of a step row, splitting and joining one, and what the bounded history and the series keep.

Plain arrays and hand-made records, no training (docs/mutation.md lists what each test here was written to
catch)."""

import numpy as np
import pytest

from nanscope.engine.schema import LAYER, OUTPUT, SCALARS, VARIABLE, Columns, StepLayout, join, output_offsets


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
