"""Which tests mutmut runs for a mutant: a pytest plugin, loaded by `[tool.mutmut]`'s `-p tests.mutation_selection`.

mutmut's stats pass records, per test, every mutated function the test calls, however deep, and each mutant then
runs every test that called its function. For the plumbing every test passes through (the store, the record
decoders and schema, JSON encoding) that is nearly the whole selection: a mutant of `StepHistory.add` ran every
rule test, and a survivor ran them all. Here a plumbing function is mapped only to the tests written for it
(`PLUMBING_TESTS`), and the property tests that write and redraw dozens of traces (`SLOW`) only to the line kinds,
the record decoders and JSON encoding they round-trip, and run last, so that `-x` stops at a fast test first.

Outside mutmut (no `MUTANT_UNDER_TEST` of "stats") it only orders the tests. docs/mutation.md says why.
"""

import os

import pytest

PLUMBING = ("nanscope.store.", "nanscope.engine.records.", "nanscope.engine.schema.", "nanscope.engine.limits.",
            "nanscope.jsonio.")
PLUMBING_TESTS = ("tests/test_mutants_store.py", "tests/test_series.py", "tests/test_roundtrip.py",
                  "tests/test_trace_lines.py", "tests/test_schema.py")
ROUND_TRIPPED = ("nanscope.store.lines.", "nanscope.engine.records.", "nanscope.jsonio.")
SLOW = {  # CPU seconds at the last measure, unloaded: each draws 20 to 100 runs through the writer and the reader
    "tests/test_roundtrip.py::test_the_scalars_lines_hold_every_step_as_the_run_does",
    "tests/test_roundtrip.py::test_a_redrawn_report_is_the_runs_report",
    "tests/test_roundtrip.py::test_a_step_line_reads_back_as_its_record",
    "tests/test_roundtrip.py::test_a_float_is_spelled_and_read_back_exactly",
}


def tested_by(function, nodeid):
    """Whether a mutant of `function` (mutmut's "module.x_name") runs the test `nodeid`."""
    test = nodeid.split("[")[0]
    if test in SLOW:
        return function.startswith(ROUND_TRIPPED)
    if function.startswith(PLUMBING):
        return test.startswith(PLUMBING_TESTS)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item):
    """In mutmut's stats pass, forget the functions `item` called that it is not to test."""
    if os.environ.get("MUTANT_UNDER_TEST") != "stats":
        return
    from mutmut.state import state  # only under mutmut, which is what records the calls

    called = state()._stats
    called -= {function for function in called if not tested_by(function, item.nodeid)}


def pytest_collection_modifyitems(items):
    """The slow property tests last: a mutant a fast test kills stops there (`-x`)."""
    items.sort(key=lambda item: item.nodeid.split("[")[0] in SLOW)
