"""Long runs: what nanscope's memory, files and finish cost at 20k and at 300k steps.

Runs `nanscope trace-steps` on the test suite's healthy small MLP
(tests/specs/healthy.yaml: Dense 4-8-1, batch 16) for a short and a long run, each
in its own process, and reports per length: peak RSS, the JSON report's size, the
trace's size (and bytes per step), the time `nanscope report TRACE` takes to redraw
it (and its peak RSS, whose growth from the short run to the long one is checked
too), the time from the last step to the process's exit, the time from a SIGINT
to the exit (a second run stopped at the same step), and the steps per second over
the first and the last 10% of the steps. Then the growth from the short
run to the long one, against the targets of issue 14.

`--fit-steps N` instead runs one `model.fit` of N steps with the NanScope callback
(the same model, a repeated tf.data dataset, steps_per_execution 32) and reports the
peak RSS after 10% and 90% of the steps and at the end (after the report is made), the steps per second over the first
and last 10%, the time from the last step to the written report (the end of NanScope's
`on_train_end`), and to `fit`'s return. The second includes what Keras and tf.data do after
the callbacks: with no nanscope at all (a plain callback), a 100k-step fit of this model
took 2.8 s from its last step to its return (12-01 18:29).

    .venv/bin/python bench/long_run.py                       # 20k vs 300k: ~10 minutes on 2 busy cores
    .venv/bin/python bench/long_run.py --short 2000 --long 20000 --no-signal
    .venv/bin/python bench/long_run.py --fit-steps 1000000   # the callback, not in CI (~30 min)
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "tests" / "specs" / "healthy.yaml"
# The redraw reads the trace in constant memory: its peak RSS may move by allocator noise, not by the trace's length.
TARGETS = {"rss_growth_mb": 100, "json_mb": 5, "trace_mb": 60, "redraw_s": 10, "redraw_rss_growth_mb": 10,
           "finish_s": 2, "rate_drop": 0.10}


class StepWatch:
    """Follows a growing trace from a thread: (wall time, CPU time of `pid`, latest step with scalars) samples.

    The CPU time (user + system, from /proc) measures the run's own speed on cores shared with
    other work; the wall time is what a user waits.
    """

    def __init__(self, path, pid, period=0.05):
        self.path, self.pid, self.period = Path(path), pid, period
        self.samples, self.latest, self._stop = [], None, threading.Event()
        self._offset, self._partial = 0, b""
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        while not self._stop.is_set():
            self._read()
            self._stop.wait(self.period)

    def _read(self):
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except OSError:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        now, cpu = time.perf_counter(), cpu_seconds(self.pid)
        for line in lines:
            if line.startswith(b'{"kind":"scalars"'):
                found = re.findall(rb"\[(\d+),", line)
                if found:
                    self.latest = int(found[-1])
                    self.samples.append((now, cpu, self.latest))

    def time_of(self, step):
        """When the trace first held `step` (the first sample at or past it), or None."""
        return next((t for t, _, s in self.samples if s >= step), None)

    def rate(self, first, last, clock=0):
        """Steps per second (clock 0: wall, 1: the process's CPU) between the samples nearest `first` and `last`."""
        a = next((sample for sample in self.samples if sample[2] >= first), None)
        b = next((sample for sample in reversed(self.samples) if sample[2] <= last), None)
        if a is None or b is None or b[clock] is None or a[clock] is None or b[clock] <= a[clock]:
            return None
        return (b[2] - a[2]) / (b[clock] - a[clock])


def cpu_seconds(pid):
    """User + system CPU seconds of process `pid` (Linux /proc), or None."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_process(argv, cwd):
    """(seconds, peak RSS in MiB, exit code) of one process, measured with wait4."""
    start = time.perf_counter()
    process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_maxrss / 1024, process.returncode


def trace_run(steps, folder, interrupt_at=None):
    """One trace-steps run: RSS, file sizes, finish time, rates; stopped by SIGINT at `interrupt_at` if given."""
    trace, report = folder / f"trace-{steps}.jsonl", folder / f"report-{steps}.json"
    limit = steps * 10 if interrupt_at else steps
    argv = [sys.executable, "-m", "nanscope", "trace-steps", str(SPEC), "--steps", str(limit), "--json", str(report),
            "--trace", str(trace)]
    process = subprocess.Popen(argv, cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    sent = None
    with StepWatch(trace, process.pid) as watch:
        while True:  # wait4, not poll: it reaps the process and reports its peak RSS
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                ended = time.perf_counter()
                process.returncode = os.waitstatus_to_exitcode(status)
                break
            if interrupt_at and sent is None and (watch.latest or 0) >= interrupt_at:
                process.send_signal(signal.SIGINT)
                sent = time.perf_counter()
            time.sleep(0.05)
    document = json.loads(report.read_text())
    done = document["steps_run"]
    result = {
        "steps": done, "exit_code": process.returncode,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "json_mb": report.stat().st_size / 2**20, "trace_mb": trace.stat().st_size / 2**20,
        "trace_bytes_per_step": trace.stat().st_size / max(done, 1),
        "first_10pct_steps_per_s": watch.rate(0, done // 10),
        "last_10pct_steps_per_s": watch.rate(done - done // 10, done - 1),
        "first_10pct_steps_per_cpu_s": watch.rate(0, done // 10, clock=1),
        "last_10pct_steps_per_cpu_s": watch.rate(done - done // 10, done - 1, clock=1),
    }
    if sent is not None:
        result["signal_to_exit_s"] = ended - sent
    else:
        last = watch.time_of(done - 1)
        result["last_step_to_exit_s"] = ended - last if last is not None else None
    return result, trace


def redraw(trace, folder):
    seconds, rss, code = run_process([sys.executable, "-m", "nanscope", "report", str(trace), "--json",
                                      str(folder / "redrawn.json")], folder)
    return {"redraw_s": seconds, "redraw_peak_rss_mb": rss, "redraw_exit_code": code}


def compare(short, long):
    """The issue's checks: growth from the short run to the long one, and the long run's own figures."""
    # Per CPU second of the run's process: on shared cores the wall-clock rate follows the others' load.
    drop = None
    if long["first_10pct_steps_per_cpu_s"] and long["last_10pct_steps_per_cpu_s"]:
        drop = 1 - long["last_10pct_steps_per_cpu_s"] / long["first_10pct_steps_per_cpu_s"]
    checks = {
        "rss_growth_mb": long["peak_rss_mb"] - short["peak_rss_mb"],
        "json_mb": long["json_mb"],
        "trace_mb": long["trace_mb"],
        "redraw_s": long["redraw_s"],
        "redraw_rss_growth_mb": long["redraw_peak_rss_mb"] - short["redraw_peak_rss_mb"],
        "finish_s": max(v for v in (long.get("last_step_to_exit_s"), long.get("signal_to_exit_s")) if v is not None),
        "rate_drop": drop,
    }
    return {name: {"value": value, "target": TARGETS[name],
                   "ok": value is not None and value <= TARGETS[name]} for name, value in checks.items()}


def trace_bench(args):
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for steps in (args.short, args.long):
            result, trace = trace_run(steps, folder)
            result.update(redraw(trace, folder))
            if not args.no_signal:
                stopped, _ = trace_run(steps, folder, interrupt_at=steps)
                result["signal_to_exit_s"] = stopped["signal_to_exit_s"]
                result["signal_steps"] = stopped["steps"]
            results[steps] = result
            print(json.dumps({str(steps): result}, indent=1), flush=True)
    results["checks"] = compare(results[args.short], results[args.long])
    print(json.dumps({"checks": results["checks"]}, indent=1))
    return results


FIT_SCRIPT = r"""
import json, os, resource, sys, time
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
from nanscope.keras import NanScope
from nanscope.runtime import tensorflow
tf, keras = tensorflow()
steps, folder = int(sys.argv[1]), sys.argv[2]
keras.utils.set_random_seed(1)
model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", steps_per_execution=32)
x = np.random.default_rng(1).standard_normal((64, 4)).astype("float32")
data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True) * 0.1)).repeat().batch(16)

class Clock(keras.callbacks.Callback):
    marks, rss = {}, {}
    def on_train_batch_end(self, batch, logs=None):
        for name, at in (("first", 0), ("tenth", steps // 10), ("last_tenth", steps - steps // 10)):
            if batch + 1 >= at and name not in self.marks:
                self.marks[name] = (time.perf_counter(), batch)
                self.rss[name] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        self.marks["last"] = (time.perf_counter(), batch)

class Reported(keras.callbacks.Callback):  # after NanScope: its on_train_end has written the report
    at = None
    def on_train_end(self, logs=None):
        Reported.at = time.perf_counter()

clock = Clock()
scope = NanScope(verbose=0, report=os.path.join(folder, "fit.json"), trace=os.path.join(folder, "fit.jsonl"))
model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[clock, scope, Reported()], verbose=0)
ended = time.perf_counter()
(t0, b0), (t1, b1), (t2, b2), (t3, b3) = (clock.marks[k] for k in ("first", "tenth", "last_tenth", "last"))
print(json.dumps({
    "steps": scope.report.steps_run, "kept_rows": len(scope.report.records),
    "peak_rss_mb_at_10pct": clock.rss["tenth"], "peak_rss_mb_at_90pct": clock.rss["last_tenth"],
    "peak_rss_mb_end": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    "first_10pct_steps_per_s": (b1 - b0) / (t1 - t0), "last_10pct_steps_per_s": (b3 - b2) / (t3 - t2),
    "last_step_to_report_s": Reported.at - t3,
    "last_step_to_fit_return_s": ended - t3,
    "json_mb": os.path.getsize(os.path.join(folder, "fit.json")) / 2**20,
    "trace_mb": os.path.getsize(os.path.join(folder, "fit.jsonl")) / 2**20,
}))
"""


def fit_bench(args):
    with tempfile.TemporaryDirectory() as tmp:
        out = subprocess.run([sys.executable, "-c", FIT_SCRIPT, str(args.fit_steps), tmp], capture_output=True,
                             text=True, cwd=REPO)
        if out.returncode:
            sys.exit(out.stderr)
        result = json.loads(out.stdout.strip().splitlines()[-1])
    print(json.dumps({f"fit {args.fit_steps}": result}, indent=1))
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--short", type=int, default=20_000)
    parser.add_argument("--long", type=int, default=300_000)
    parser.add_argument("--no-signal", action="store_true", help="skip the runs stopped by SIGINT")
    parser.add_argument("--fit-steps", type=int, default=0, help="run model.fit with the callback for N steps instead")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    result = fit_bench(args) if args.fit_steps else trace_bench(args)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1, default=str))


if __name__ == "__main__":
    main()
