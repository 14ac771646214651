"""Every way to train with nanscope keeps its threads and file descriptors flat from 10% to 90% of a run.

A leak of one thread or descriptor per step or per few steps (the multi-worker runs of
issue 21 gained ~3.5 threads a step) shows as hundreds between the 10% and the 90% sample.
The ways run through bench/soak.py's `run_child`, the meter reading /proc/self.

In the default run (a few seconds a way): the one-process ways in this test process, one
after the other; each MirroredStrategy way in its own process (two logical CPUs must be set
before TensorFlow starts; a second strategy's collectives in one process clash with the
first's); fit under MultiWorkerMirroredStrategy in two worker processes on 127.0.0.1.
trace-steps under `multi_worker` is tests/test_multi_worker.py's
test_threads_and_descriptors_stay_flat_from_step_100_to_500.

Under the `soak` marker (`pytest -m soak`, minutes on 2 cores): every way for 1,000 steps,
each group of ways in its own processes. bench/soak.py runs the same ways for 100k steps
(bench/README.md has the table).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
import soak

# A pool thread TensorFlow starts on first use may land between the two samples; a leak per step is hundreds.
FLAT = 3

# --- the default run: enough steps that a per-step leak is hundreds, few enough for seconds a way --------------

FAST_STEPS = 500  # samples at steps 50 and 450: a thread or descriptor a step is +400, one every 100 steps +4
FAST_REPLAYS = 15  # a replay loads the bundle and replays one step op by op (~0.1-0.5 s): samples at 2 and 14
IN_PROCESS = ("trace", "fit", "fit-spe", "instrument", "compare-clipping", "verify", "replay")
OWN_PROCESSES = ("trace-mirrored", "fit-mirrored", "fit-multi-worker")


def assert_flat(summary):
    (threads, threads_later), (fds, fds_later) = summary["threads"], summary["fds"]
    assert threads_later - threads <= FLAT, summary
    assert fds_later - fds <= FLAT, summary


@pytest.fixture(scope="module")
def own_processes(tmp_path_factory):
    """The ways that need their own processes, started together; they run while this process measures its own."""
    folder = tmp_path_factory.mktemp("growth")
    started = [soak.start_way(way, FAST_STEPS, folder / way) for way in OWN_PROCESSES]
    yield started
    for process in (process for processes in started for process in processes if process.poll() is None):
        process.kill()  # a test that failed before collecting it
        process.communicate()


@pytest.fixture(scope="module")
def fast_summaries(own_processes):
    return {summary["way"]: summary for processes in own_processes for summary in soak.collect(processes, timeout=300)}


@pytest.mark.parametrize("way", IN_PROCESS)
def test_threads_and_descriptors_stay_flat_in_this_process(own_processes, way, tmp_path):
    steps = FAST_REPLAYS if way == "replay" else FAST_STEPS
    summary = soak.run_child(way, steps, tmp_path)
    assert summary["steps"] >= steps and summary["steps_at"][1] - summary["steps_at"][0] >= 0.7 * steps, summary
    assert_flat(summary)


@pytest.mark.parametrize("way", OWN_PROCESSES)
def test_threads_and_descriptors_stay_flat_in_their_own_processes(fast_summaries, way):
    summary = fast_summaries[way]
    assert summary["steps"] >= FAST_STEPS and summary["steps_at"][1] - summary["steps_at"][0] >= 0.7 * FAST_STEPS
    assert_flat(summary)


def test_the_check_catches_growth():
    meter = soak.Meter(10)
    leaked = []
    for _ in range(100):
        leaked.append(open(__file__))  # noqa: SIM115 (one descriptor a step, kept open)
        meter.tick()
    summary = meter.summary()
    for handle in leaked:
        handle.close()
    assert summary["fds"][1] - summary["fds"][0] == 80
    assert soak.checks(summary)["fds"] == {"value": 80, "ok": False}
    with pytest.raises(AssertionError):
        assert_flat(summary)


# --- `pytest -m soak`: every way for 1,000 steps ---------------------------------------------------------------

STEPS = 1000
REPLAYS = 40
GROUPS = ("trace,fit,fit-spe,instrument,compare-clipping,verify,replay", "trace-mirrored", "fit-mirrored",
          "trace-multi-worker", "fit-multi-worker")


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("soak")
    started = [soak.start_way(ways, STEPS, folder / f"group{i}", REPLAYS) for i, ways in enumerate(GROUPS)]
    return {summary["way"]: summary for processes in started for summary in soak.collect(processes, timeout=600)}


@pytest.mark.soak
def test_every_way_to_train_ran(summaries):
    assert sorted(summaries) == sorted(soak.WAYS)
    for way, summary in summaries.items():
        expected = REPLAYS if way == "replay" else STEPS
        assert summary["steps"] >= expected, summary
        assert summary["steps_at"][1] - summary["steps_at"][0] >= 0.7 * expected, summary


@pytest.mark.soak
@pytest.mark.parametrize("way", soak.WAYS)
def test_threads_and_descriptors_stay_flat(summaries, way):
    assert_flat(summaries[way])
