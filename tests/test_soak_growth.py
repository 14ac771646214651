"""Every way to train with nanscope keeps its threads and file descriptors flat from 10% to 90% of a run.

A leak of one thread or descriptor per step or per few steps (the multi-worker runs of
issue 21 gained ~3.5 threads a step) shows as hundreds between step 100 and step 900.
The ways run through bench/soak.py's `--child`, five groups of processes at once: the
one-process ways one after the other in one process, each MirroredStrategy way in its own
(2 logical CPUs; a second strategy's collectives in one process clash with the first's),
and each multi-worker way in two worker processes on 127.0.0.1.
bench/soak.py runs the same ways for 100k steps (bench/README.md has the table).
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
import soak

# Minutes on 2 cores (five groups of TensorFlow processes): kept out of the default run (`pytest -m soak` runs it).
pytestmark = pytest.mark.soak

STEPS = 1000
REPLAYS = 40  # a replay (load the bundle, replay one step op by op) takes ~0.1-0.5 s
GROUPS = ("trace,fit,fit-spe,instrument,compare-clipping,verify,replay", "trace-mirrored", "fit-mirrored",
          "trace-multi-worker", "fit-multi-worker")
# A pool thread TensorFlow starts on first use may land between the two samples; a leak per step is hundreds.
FLAT = 3


@pytest.fixture(scope="module")
def summaries(tmp_path_factory):
    folder = tmp_path_factory.mktemp("soak")
    started = [soak.start_way(ways, STEPS, folder / f"group{i}", REPLAYS) for i, ways in enumerate(GROUPS)]
    return {summary["way"]: summary for processes in started for summary in soak.collect(processes, timeout=600)}


def test_every_way_to_train_ran(summaries):
    assert sorted(summaries) == sorted(soak.WAYS)
    for way, summary in summaries.items():
        expected = REPLAYS if way == "replay" else STEPS
        assert summary["steps"] >= expected, summary
        assert summary["steps_at"][1] - summary["steps_at"][0] >= 0.7 * expected, summary


@pytest.mark.parametrize("way", soak.WAYS)
def test_threads_and_descriptors_stay_flat(summaries, way):
    summary = summaries[way]
    (threads, threads_later), (fds, fds_later) = summary["threads"], summary["fds"]
    assert threads_later - threads <= FLAT, summary
    assert fds_later - fds <= FLAT, summary


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
