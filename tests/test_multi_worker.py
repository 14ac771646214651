"""train.distribute: multi_worker and the callback under MultiWorkerMirroredStrategy, with real worker processes.

Each test starts two worker processes on 127.0.0.1 (free ports, CPU only), each with its
own TF_CONFIG, as a launcher would. They are kept few and small: each pair costs a few
seconds of TensorFlow start-up.
"""

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from nanscope.report.redraw import load_trace

SPECS = Path(__file__).parent / "specs" / "multi_worker"
REPO = Path(__file__).resolve().parent.parent
STARTED = []  # every worker process start_workers started, killed after its test


@pytest.fixture(autouse=True)
def no_worker_outlives_its_test():
    """Kill the workers a test leaves running: one that fails or times out (a `communicate` past its timeout
    raises) would leave them training on, orphaned, for the rest of the suite and after it."""
    yield
    while STARTED:
        process = STARTED.pop()
        if process.poll() is None:
            process.kill()
        process.communicate()


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def tf_config(ports, task):
    return json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                       "task": {"type": "worker", "index": task}})


def start_workers(args, folder, ports, tasks=None, replicas=1):
    """One process per task, each with its own TF_CONFIG and its own output names (w0.json, w1.json...)."""
    processes = []
    for task in tasks if tasks is not None else range(len(ports)):
        env = {**os.environ, "TF_CONFIG": tf_config(ports, task), "TF_CPP_MIN_LOG_LEVEL": "3",
               "NANSCOPE_CPU_REPLICAS": str(replicas),  # this checkout's nanscope, whichever is installed
               "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        command = [sys.executable, *[a.format(task=task) for a in args]]
        processes.append(subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        STARTED.append(processes[-1])
    return processes


def trace_args(spec):
    return ["-m", "nanscope", "trace-steps", str(SPECS / spec), "--json", "w{task}.json", "--trace", "w{task}.jsonl"]


def finish(processes, timeout=120):
    done = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        done.append((process.returncode, out, err))
    return done


def test_nan_on_worker_1_is_found_by_the_chief(tmp_path):
    (chief, _, chief_err), (worker, _, worker_err) = finish(
        start_workers(trace_args("nan-on-worker-1.yaml"), tmp_path, free_ports(2)))
    assert (chief, worker) == (1, 1), chief_err[-2000:] + worker_err[-2000:]
    report = json.loads((tmp_path / "w0.json").read_text())
    assert report["run"]["distribute"] == {"strategy": "MultiWorkerMirroredStrategy", "replicas": 2, "workers": 2,
                                           "replicas_per_worker": 1}
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["worker"], first["replica"]) == (1, "data", 1, 1)
    assert "dataset rows 29" in first["detail"][0]  # step 1's batch is rows 16-31; worker 1 takes 24-31
    assert report["steps"][0]["worker_nonfinite"] == [0, 0]
    healthy, bad = report["steps"][1]["worker_nonfinite"]
    assert healthy == 0 and bad > 0
    # `nanscope report` redraws the same findings from the chief's trace, per-worker counts included.
    redrawn = load_trace(tmp_path / "w0.jsonl").to_json()
    assert (redrawn["first_nonfinite"], redrawn["steps"]) == (first, report["steps"])
    # Only the chief writes; the other worker says what it is in one line.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w0.json", "w0.jsonl"]
    assert worker_err.strip().splitlines() == ["nanscope: worker task 1 of 2: the chief (task 0) writes the report; "
                                               "exit 1 (the chief's)"]


def wait_for_steps(trace, count, process, deadline=240):
    started = time.monotonic()
    while time.monotonic() - started < deadline:
        if trace.exists() and trace.read_text().count('"kind": "step"') >= count:
            return
        if process.poll() is not None:
            raise AssertionError(process.communicate()[1][-2000:])
        time.sleep(0.1)
    raise AssertionError("the chief wrote no steps")


def threads_and_fds(pid):
    """(threads, open file descriptors) of a live process, from /proc."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Threads:\s+(\d+)", status, re.M).group(1)), len(os.listdir(f"/proc/{pid}/fd"))


def test_threads_and_descriptors_stay_flat_from_step_100_to_500(tmp_path):
    # A per-collective timeout (CommunicationOptions(timeout_seconds=...)) kept one sleeping thread per collective
    # for the whole timeout (600 s here, so none ends in this test): ~3.5 more threads a step, 1,400 from 100 to 500.
    document = yaml.safe_load((SPECS / "long.yaml").read_text())
    document["train"]["distribute_timeout_s"] = 600
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**document, "model": {"factory": str(SPECS / "models.py:mlp")},
                                                        "data": {**document["data"],
                                                                 "factory": str(SPECS / "models.py:regression")}}))
    processes = start_workers(["-m", "nanscope", "trace-steps", "spec.yaml", "--trace", "w{task}.jsonl"], tmp_path,
                              free_ports(2))
    try:
        wait_for_steps(tmp_path / "w0.jsonl", 100, processes[0], deadline=180)
        early = [threads_and_fds(p.pid) for p in processes]
        wait_for_steps(tmp_path / "w0.jsonl", 500, processes[0], deadline=180)
        late = [threads_and_fds(p.pid) for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.communicate()
    for (threads, fds), (threads_later, fds_later) in zip(early, late):
        assert threads_later - threads <= 5 and fds_later - fds <= 5, (early, late)


DEADLINE_SCRIPT = """
import time
import tensorflow as tf
from nanscope.engine.deadline import CollectiveDeadline
deadline = CollectiveDeadline(1.5)
started = time.monotonic()
try:
    with deadline.bounded():  # a group of 2 that only this member joins: it waits for the other forever
        tf.raw_ops.CollectiveReduceV2(input=tf.ones([2]), group_size=tf.constant(2), group_key=tf.constant(1),
                                      instance_key=tf.constant(1), ordering_token=[], merge_op="Add", final_op="Id")
except tf.errors.DeadlineExceededError as exc:
    print(round(time.monotonic() - started, 1), exc.message.split("aborted by: ")[1].splitlines()[0])
"""


def test_a_collective_that_outlasts_the_deadline_is_aborted_with_deadline_exceeded():
    # What a worker that is alive (its heartbeat answers) but never reaches the all-reduce meets.
    done = subprocess.run([sys.executable, "-c", DEADLINE_SCRIPT], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"})
    seconds, message = done.stdout.strip().split(" ", 1)
    assert message == "no answer from the other workers within 1.5 s"
    assert 1.5 <= float(seconds) < 10


def test_a_killed_worker_stops_the_chief_within_the_timeout(tmp_path):
    chief, worker = start_workers([*trace_args("long.yaml")], tmp_path, free_ports(2))
    wait_for_steps(tmp_path / "w0.jsonl", 3, chief)
    worker.kill()
    killed = time.monotonic()
    _, err = chief.communicate(timeout=60)
    assert time.monotonic() - killed < 20  # train.distribute_timeout_s in long.yaml
    worker.communicate()
    assert chief.returncode == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith("nanscope: error: train.distribute: multi_worker: worker task 1 (127.0.0.1:")
    report = json.loads((tmp_path / "w0.json").read_text())
    assert report["stopped"] == line.removeprefix("nanscope: error: ").removesuffix(
        "; the report covers the steps before it")
    assert report["steps_run"] >= 3 and report["first_nonfinite"] is None


def test_ctrl_c_on_a_worker_ends_the_run_everywhere(tmp_path):
    chief, worker = start_workers([*trace_args("long.yaml")], tmp_path, free_ports(2))
    wait_for_steps(tmp_path / "w0.jsonl", 3, chief)
    worker.send_signal(signal.SIGINT)
    (chief_code, _, chief_err), (worker_code, _, worker_err) = finish([chief, worker], timeout=60)
    assert (chief_code, worker_code) == (130, 130), chief_err[-2000:] + worker_err[-2000:]
    report = json.loads((tmp_path / "w0.json").read_text())
    assert report["interrupted"] and 3 <= report["steps_run"] < 100000
    assert any("by a signal to worker task 1" in note for note in report["notes"])


def test_a_worker_that_never_joins_stops_the_other_at_start_up(tmp_path):
    ports = free_ports(2)
    document = yaml.safe_load((SPECS / "healthy.yaml").read_text())
    document["train"]["distribute_timeout_s"] = 3
    (tmp_path / "spec.yaml").write_text(yaml.safe_dump({**document, "model": {"factory": str(SPECS / "models.py:mlp")},
                                                        "data": {**document["data"],
                                                                 "factory": str(SPECS / "models.py:regression")}}))
    started = time.monotonic()
    [(code, _, err)] = finish(start_workers(["-m", "nanscope", "trace-steps", "spec.yaml"], tmp_path, ports, tasks=[0]))
    assert code == 2
    assert time.monotonic() - started < 60
    assert err.strip().splitlines() == [
        f"nanscope: error: train.distribute: multi_worker: worker task 1 (127.0.0.1:{ports[1]}) did not join within "
        "3 s (train.distribute_timeout_s); every worker must run the same command with its own TF_CONFIG"]


def test_callback_in_a_two_worker_fit(tmp_path):
    done = finish(start_workers([str(SPECS / "fit_callback.py"), str(tmp_path)], tmp_path, free_ports(2)))
    for code, _, err in done:
        assert code == 0, err[-2000:]
    seen = [json.loads(out.strip().splitlines()[-1]) for _, out, _ in done]
    # Every worker recorded the same steps and per-worker counts; worker 1's rows held the NaN.
    bad = seen[0]["worker_nonfinite"][1][1]
    assert bad > 0
    for task, worker in enumerate(seen):
        records = worker.pop("records")
        del worker["collectives"], worker["losses"]
        assert worker == {"task": task, "steps": [0, 1], "worker_nonfinite": [[0, 0], [0, bad]],
                          "first": {"step": 1, "worker": 1}}
        # The rows as they were when every replica's row had an all-reduce of its own (before it rode on Keras').
        assert records[0]["loss"] == 5.956191062927246 and math.isnan(records[1]["loss"])
        assert [r["replica_nonfinite"] for r in records] == [[0, 0], [0, 51]]
        assert [(r["x_nonfinite"], r["grad_nonfinite"]) for r in records] == [(0, 0), (1, 49)]
        assert [[(layer["nonfinite"], layer["max_abs"]) for layer in r["layers"]] for r in records] == [
            [(0, 2.0698938369750977), (0, 1.21526300907135)], [(8, 2.2001733779907227), (1, 1.7745252847671509)]]
    # Only the chief wrote its report, trace and TensorBoard log.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w0"]
    assert sorted(p.name for p in (tmp_path / "w0").iterdir()) == ["fit.json", "fit.jsonl", "tb"]
    report = json.loads((tmp_path / "w0" / "fit.json").read_text())
    assert report["run"]["distribute"] == {"strategy": "MultiWorkerMirroredStrategy", "replicas": 2, "workers": 2,
                                           "replicas_per_worker": 1}
    assert (report["first_nonfinite"]["worker"], report["first_nonfinite"]["replica"]) == (1, 1)


@pytest.mark.parametrize("tf_config, message", [
    (None, "TF_CONFIG is not set"),
    ("{cluster", "TF_CONFIG is not JSON"),
    (json.dumps({"cluster": {"worker": "a:1"}, "task": {"type": "worker", "index": 0}}), "`cluster.worker` must be"),
    (json.dumps({"cluster": {"worker": ["a:1"], "chief": ["b:1"]}, "task": {"type": "worker", "index": 0}}),
     "only `worker` tasks are supported"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "ps", "index": 0}}), "`task.type` must be"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}),
     "`task.index` must be a whole number from 0 to 1. Received: index=2"),
])
def test_a_bad_tf_config_is_one_line_naming_it(tmp_path, monkeypatch, tf_config, message):
    from typer.testing import CliRunner

    from nanscope.cli import app

    if tf_config is None:
        monkeypatch.delenv("TF_CONFIG", raising=False)
    else:
        monkeypatch.setenv("TF_CONFIG", tf_config)
    done = CliRunner().invoke(app, ["trace-steps", str(SPECS / "healthy.yaml"), "--trace", str(tmp_path / "t.jsonl")])
    assert done.exit_code == 2
    lines = done.output.strip().splitlines()
    assert len(lines) == 1 and "train.distribute: multi_worker: TF_CONFIG" in lines[0] and message in lines[0]
    assert not (tmp_path / "t.jsonl").exists()


def test_verify_is_refused_before_joining_the_cluster(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from nanscope.cli import app

    monkeypatch.setenv("TF_CONFIG", tf_config(free_ports(2), 0))
    done = CliRunner().invoke(app, ["trace-steps", str(SPECS / "healthy.yaml"), "--verify",
                                    "--trace", str(tmp_path / "t.jsonl")])
    assert done.exit_code == 2
    assert done.output.strip().splitlines() == [
        f"nanscope: error: {SPECS / 'healthy.yaml'}: train.distribute: multi_worker: --verify is not supported "
        "(run --verify on one machine (train.distribute: mirrored))"]


def test_rollback_gives_the_verdicts_naming_the_worker(tmp_path):
    # Every worker keeps the state before each step on its devices and re-runs the step with the others (the same
    # records, so the same decisions): the chief's report names the replica and its worker in each verdict.
    args = [*trace_args("nan-on-worker-1.yaml"), "--on-nonfinite", "rollback"]
    (chief, _, chief_err), (worker, _, worker_err) = finish(start_workers(args, tmp_path, free_ports(2)))
    assert (chief, worker) == (1, 1), chief_err[-2000:] + worker_err[-2000:]
    report = json.loads((tmp_path / "w0.json").read_text())
    first = report["first_nonfinite"]
    assert (first["step"], first["worker"], first["replica"], first["reproducible"], first["origin"]) == (
        1, 1, 1, True, "batch")
    assert (first["reproducible_replicas"], first["origin_replicas"]) == ([1], [1])
    assert "origin: batch: from the state before step 0 the same batch is non-finite too (data pass) on replica 1 " \
           "(worker 1)" in report["notes"]
    assert [(i["step"], i["action"], i["restored_step"]) for i in report["interventions"]] == [(1, "rollback", 0)]
    lowered = [{"before": pytest.approx(0.01), "after": pytest.approx(0.001)}]
    assert report["interventions"][0]["learning_rate"] == lowered
    assert any(note.startswith("guard: under train.distribute: multi_worker a rollback lowers the learning rate")
               for note in report["notes"])
    assert report["steps_run"] == 4 and all(math.isfinite(step["loss"]) for step in report["steps"][2:])
