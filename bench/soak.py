"""Soak: every way to train with nanscope, for a long run, with threads, descriptors, memory and speed over time.

Each way runs in its own process (two, one per worker, on 127.0.0.1 for the multi-worker
ways) on the test suite's small MLP (Dense 4-8-1, batch 16). Every so many steps the
process notes the time, its thread count (`Threads:` in /proc/self/status), its open file
descriptors (/proc/self/fd) and its RSS; the table gives them at 10% and 90% of the steps,
and the steps per second (of wall time, and of the process's CPU time) over the first and
the last 10%. Targets (issue 21): threads and descriptors flat within 5, RSS growth at most
50 MB, steps per CPU second within 10% (the wall-clock rate on shared cores follows the
neighbours' load).

Ways (the step counted is one train step unless said):
  trace               trace-steps (run_trace) alone
  trace-mirrored      trace-steps, train.distribute: mirrored, NANSCOPE_CPU_REPLICAS=2
  trace-multi-worker  trace-steps, train.distribute: multi_worker, 2 workers (the chief measured)
  fit                 model.fit with the NanScope callback
  fit-spe             the same, steps_per_execution=32
  fit-mirrored        the callback under MirroredStrategy over 2 logical CPUs
  fit-multi-worker    the callback under MultiWorkerMirroredStrategy, 2 workers (the chief measured)
  instrument          a tf.function train step under nanscope.instrument
  compare-clipping    compare_clipping with strategies none and clipnorm=1 (a step of either counts)
  verify              trace-steps --verify on tests/specs/exploding.yaml: the steps of the run and of
                      every fix it tries (each fix trains train.steps steps)
  replay              `nanscope replay`'s replay_repro of one saved step, again and again (a replay counts)

    .venv/bin/python bench/soak.py                                  # every way, 100k steps (50k multi-worker)
    .venv/bin/python bench/soak.py --ways trace,fit --steps 20000
    .venv/bin/python bench/soak.py --child fit,instrument --steps 2000 --folder /tmp/soak   # in this process

tests/test_soak_growth.py runs every way for 1,000 steps (replay: 40 replays) through `--child` and fails
on per-step growth of threads or descriptors.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parent.parent
SPECS = REPO / "tests" / "specs"
TARGETS = {"threads": 5, "fds": 5, "rss_mb": 50, "rate_drop": 0.10}
MULTI_WORKER = ("trace-multi-worker", "fit-multi-worker")
MIRRORED = ("trace-mirrored", "fit-mirrored")
PLAIN_WAYS = ("fit", "fit-spe", "fit-mirrored", "fit-multi-worker")
WAYS = ("trace", "trace-mirrored", "trace-multi-worker", "fit", "fit-spe", "fit-mirrored", "fit-multi-worker",
        "instrument", "compare-clipping", "verify", "replay")


def resources():
    """(threads, open file descriptors, RSS in MB) of this process, from /proc."""
    status = Path("/proc/self/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return (int(fields["Threads"]), len(os.listdir("/proc/self/fd")),
            int(fields["VmRSS"].split()[0]) / 1024)


class Meter:
    """Counts steps; every `every` steps keeps (wall s, steps, threads, fds, RSS MB, CPU s of the process), and
    appends each sample to `log` (a JSON-lines file) when given, so that a run stopped early can be summarised."""

    def __init__(self, every, log=None):
        self.every, self.steps, self.samples, self._next = max(1, int(every)), 0, [], 0
        self.log = open(log, "a", encoding="utf-8") if log else None  # noqa: SIM115 (open for the whole run)

    def tick(self, count=1):
        self.steps += count
        if self.steps >= self._next:
            self._sample()
            self._next = self.steps + self.every

    def _sample(self):
        self.samples.append((time.perf_counter(), self.steps, *resources(), time.process_time()))
        if self.log is not None:
            self.log.write(json.dumps(self.samples[-1]) + "\n")
            self.log.flush()

    def summary(self):
        """Threads, fds and RSS at 10% and 90% of the steps; steps/s over the first and the last 10%."""
        self._sample()
        if self.log is not None:
            self.log.close()
            self.log = None
        return summarize(self.samples)


def summarize(samples):
    """A Meter's figures from its samples (the last one taken as the end of the run)."""
    total = samples[-1][1]

    def at(fraction):
        return min(samples, key=lambda s: abs(s[1] - fraction * total))

    first, tenth, ninetieth, last = samples[0], at(0.1), at(0.9), samples[-1]

    def rate(a, b, clock=0):
        return (b[1] - a[1]) / (b[clock] - a[clock]) if b[clock] > a[clock] and b[1] > a[1] else None

    return {"steps": total, "steps_at": [tenth[1], ninetieth[1]],
            "threads": [tenth[2], ninetieth[2]], "fds": [tenth[3], ninetieth[3]],
            "rss_mb": [round(tenth[4], 1), round(ninetieth[4], 1)],
            "steps_per_s": [rate(first, tenth), rate(ninetieth, last)],
            "steps_per_cpu_s": [rate(first, tenth, 5), rate(ninetieth, last, 5)]}


def spec(name="healthy.yaml", steps=1000, **train):
    """A RunSpec of tests/specs/NAME with `steps` and any other train fields replaced."""
    import yaml

    from nanscope.spec.load import parse_spec

    document = yaml.safe_load((SPECS / name).read_text())
    document["train"].update(steps=steps, **train)
    return parse_spec(document, source=str(SPECS / name))


def trace_way(steps, meter, folder, **train):
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    report = run_trace(spec(steps=steps, **train), TraceOptions(trace_path=folder / "trace.jsonl",
                                                                 on_step=lambda record: meter.tick()))
    return report.steps_run


def fit_way(steps, meter, folder, strategy=None, per_execution=1, plain=False):
    from nanscope.keras import NanScope
    from nanscope.runtime import tensorflow
    from rich.console import Console

    tf, keras = tensorflow()
    import numpy as np

    with strategy.scope() if strategy is not None else _nothing():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="mse", steps_per_execution=per_execution)
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _multi_worker_fit_workarounds(model, strategy)
    x = np.random.default_rng(1).standard_normal((64, 4)).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, x.sum(axis=1, keepdims=True) * 0.1)).repeat().batch(16)
    if strategy is not None:
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        data = data.with_options(options)

    class Ticks(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            meter.tick(batch + 1 - meter.steps)

    if plain:  # the same fit without nanscope, to tell nanscope's growth from Keras' and TensorFlow's
        model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[Ticks()], verbose=0)
        return meter.steps
    scope = NanScope(report=folder / "fit.json", trace=folder / "fit.jsonl", console=Console(quiet=True))
    model.fit(data, epochs=1, steps_per_epoch=steps, callbacks=[Ticks(), scope], verbose=0)
    return scope.report.steps_run


def _multi_worker_fit_workarounds(model, strategy):
    """keras#20585, as tests/specs/multi_worker/fit_callback.py: build from this worker's first replica's batch,
    and reduce fit's per-step logs over this worker's replicas."""
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    from nanscope.runtime import tensorflow

    tf, _ = tensorflow()
    original = model._maybe_symbolic_build

    def build_from_local_batch(iterator=None, data_batch=None):
        if iterator is not None:
            for _, _, batches in iterator:
                data_batch = tf.nest.map_structure(lambda v: strategy.experimental_local_results(v)[0], next(batches))
                break
        return original(data_batch=data_batch)

    model._maybe_symbolic_build = build_from_local_batch
    keras_tf_trainer._collective_all_reduce_multi_worker = lambda strategy: False


def instrument_way(steps, meter, folder):
    import numpy as np

    import nanscope
    from nanscope.runtime import tensorflow

    tf, keras = tensorflow()
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(1e-3)
    loss_fn = keras.losses.MeanSquaredError()

    @nanscope.instrument(model, optimizer, report=folder / "instrument.json", verbose=0)
    @tf.function
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = loss_fn(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    x = np.random.default_rng(1).standard_normal((64, 4)).astype("float32")
    batches = [(tf.constant(x[i:i + 16]), tf.constant(x[i:i + 16].sum(axis=1, keepdims=True) * 0.1))
               for i in range(0, 64, 16)]
    for step in range(steps):
        train_step(*batches[step % 4])
        meter.tick()
    return len(train_step.nanscope.finish().records) and steps


def compare_clipping_way(steps, meter, folder):
    from nanscope.run.clipping import compare_clipping, parse_strategies

    report = compare_clipping(spec(steps=steps), parse_strategies("none,clipnorm=1"),
                              on_progress=lambda name, done, total: meter.tick(done - meter.steps))
    return len(report.runs) * steps


def verify_way(steps, meter, folder):
    import nanscope.run.verify as verify
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    original = verify.run_experiment

    def counted(*args, **kwargs):  # the fixes' steps, which --verify runs without a progress callback
        return original(*args, **{**kwargs, "on_step": lambda record: meter.tick()})

    verify.run_experiment = counted
    try:
        report = run_trace(spec("exploding.yaml", steps=steps),
                           TraceOptions(trace_path=folder / "verify.jsonl", verify=True,
                                        on_step=lambda record: meter.tick()))
    finally:
        verify.run_experiment = original
    return report.steps_run


def replay_way(steps, meter, folder):
    from nanscope.replay import replay_repro
    from nanscope.run.trace import run_trace
    from nanscope.spec.options import TraceOptions

    bundle = folder / "repro"
    run_trace(spec("exploding.yaml", steps=200), TraceOptions(trace_path=folder / "saved.jsonl", save_repro=bundle))
    for _ in range(steps):
        replay_repro(bundle)
        meter.tick()
    return steps


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def run_child(way, steps, folder, plain=False, samples=None):
    """Run one way in this process (a fit way without nanscope when `plain`); the Meter's summary (None on a
    non-chief worker)."""
    if plain and way not in PLAIN_WAYS:
        raise ValueError(f"only the fit ways run without nanscope. Received: {way}")
    meter = Meter(max(1, steps // 200), log=samples)
    chief = True
    if way == "trace":
        trace_way(steps, meter, folder)
    elif way == "trace-mirrored":
        trace_way(steps, meter, folder, distribute="mirrored")
    elif way == "trace-multi-worker":
        chief = json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0
        trace_way(steps, meter, folder / f"w{int(not chief)}", distribute="multi_worker", distribute_timeout_s=120)
    elif way in ("fit", "fit-spe"):
        fit_way(steps, meter, folder, per_execution=32 if way == "fit-spe" else 1, plain=plain)
    elif way == "fit-mirrored":
        from nanscope.engine.distributed import mirrored_strategy

        fit_way(steps, meter, folder, strategy=mirrored_strategy(), plain=plain)
    elif way == "fit-multi-worker":
        import tensorflow as tf

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        chief = strategy.cluster_resolver.task_id == 0
        fit_way(steps, meter, folder / f"w{strategy.cluster_resolver.task_id}", strategy=strategy, plain=plain)
    else:
        {"instrument": instrument_way, "compare-clipping": compare_clipping_way, "verify": verify_way,
         "replay": replay_way}[way](steps, meter, folder)
    return {"way": way, "nanscope": not plain, **meter.summary()} if chief else None


_HANDED_OUT = set()


def free_ports(count):
    """`count` free ports on 127.0.0.1, none handed out before by this process (two clusters started at once
    must not get the same ports while neither has bound them yet)."""
    ports = []
    while len(ports) < count:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            ports.append(port)
    return ports


def start_way(ways, steps, folder, replays=None, plain=False, samples=None):
    """The processes of `ways` (comma-separated, run one after the other in one process; a multi-worker way
    alone, in two processes, one per worker), each running `--child` (with `--plain`: without nanscope)."""
    base = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "TF_CPP_MIN_LOG_LEVEL": "3"}
    argv = [sys.executable, str(Path(__file__).resolve()), "--child", ways, "--steps", str(steps), "--folder",
            str(folder)] + (["--replays", str(replays)] if replays else []) + (["--plain"] if plain else []) + (
        ["--samples", str(samples)] if samples else [])
    names = ways.split(",")
    if not set(names) & set(MULTI_WORKER):
        env = {**base, "NANSCOPE_CPU_REPLICAS": "2"} if set(names) & set(MIRRORED) else base
        return [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)]
    if len(names) > 1:
        raise ValueError(f"a multi-worker way runs alone in its processes. Received: {ways}")
    ports = free_ports(2)
    processes = []
    for task in range(2):
        config = {"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]}, "task": {"type": "worker", "index": task}}
        processes.append(subprocess.Popen(argv, env={**base, "TF_CONFIG": json.dumps(config),
                                                     "NANSCOPE_CPU_REPLICAS": "1"},
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return processes


def collect(processes, timeout=None):
    """Every summary the processes print (the chief's, for a multi-worker way); RuntimeError when one fails."""
    results = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        if process.returncode:
            raise RuntimeError(f"{process.args[3]}: exit {process.returncode}: {err[-3000:]}")
        results += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return results


def checks(summary):
    """Each target: the value and whether it holds."""
    # Per CPU second of the process: on shared cores the wall-clock rate follows the other work's load.
    threads, fds, rss, rates = summary["threads"], summary["fds"], summary["rss_mb"], summary["steps_per_cpu_s"]
    drop = 1 - rates[1] / rates[0] if all(rates) else None
    values = {"threads": threads[1] - threads[0], "fds": fds[1] - fds[0], "rss_mb": rss[1] - rss[0],
              "rate_drop": drop}
    return {name: {"value": value, "ok": value is not None and value <= TARGETS[name]}
            for name, value in values.items()}


def table(rows):
    lines = ["| way | steps | threads 10% -> 90% | fds 10% -> 90% | RSS MB 10% -> 90% | steps/s first -> last 10% |"
             " steps/CPU-s first -> last 10% | targets |", "|---|---:|---|---|---|---|---|---|"]
    for row in rows:
        rates = " -> ".join(f"{r:.0f}" if r else "n/a" for r in row["steps_per_s"])
        cpu_rates = " -> ".join(f"{r:.0f}" if r else "n/a" for r in row["steps_per_cpu_s"])
        ok = "all met" if all(c["ok"] for c in row["checks"].values()) else "missed: " + ", ".join(
            name for name, c in row["checks"].items() if not c["ok"])
        name = row["way"] if row.get("nanscope", True) else f"{row['way']} without nanscope"
        lines.append(f"| {name} | {row['steps']:,} | {row['threads'][0]} -> {row['threads'][1]} | "
                     f"{row['fds'][0]} -> {row['fds'][1]} | {row['rss_mb'][0]:.0f} -> {row['rss_mb'][1]:.0f} | "
                     f"{rates} | {cpu_rates} | {ok} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ways", default=",".join(WAYS))
    parser.add_argument("--steps", type=int, default=100_000)
    parser.add_argument("--multi-worker-steps", type=int, default=50_000)
    parser.add_argument("--replays", type=int, default=None, help="replays for the replay way (default: --steps)")
    parser.add_argument("--plain", action="store_true", help="run the fit ways without nanscope (a baseline)")
    parser.add_argument("--samples", type=Path, help="append each sample to FOLDER/WAY.jsonl as it is taken "
                        "(WAY-plain.jsonl without nanscope; a multi-worker way: the chief's)")
    parser.add_argument("--summarize", type=Path, nargs="+", metavar="JSONL",
                        help="print the figures of these sample files (of runs stopped early, say) and exit")
    parser.add_argument("--child", help="run these ways (comma-separated) in this process and print their JSON")
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--out", type=Path, help="also write every way's figures to this JSON file")
    args = parser.parse_args()
    if args.summarize:
        rows = []
        for path in args.summarize:
            samples = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            name = path.stem.removesuffix("-plain")
            rows.append({"way": name, "nanscope": not path.stem.endswith("-plain"), **summarize(samples)})
            rows[-1]["checks"] = checks(rows[-1])
            print(json.dumps(rows[-1]), flush=True)
        print(table(rows))
        return
    if args.child:
        for way in args.child.split(","):
            steps = args.replays if way == "replay" and args.replays else args.steps
            (args.folder / way).mkdir(parents=True, exist_ok=True)
            log = None
            if args.samples and (way not in MULTI_WORKER or json.loads(os.environ["TF_CONFIG"])["task"]["index"] == 0):
                args.samples.mkdir(parents=True, exist_ok=True)
                log = args.samples / f"{way}{'-plain' if args.plain else ''}.jsonl"
            summary = run_child(way, steps, args.folder / way, plain=args.plain, samples=log)
            if summary is not None:
                print(json.dumps(summary), flush=True)
        return
    rows = []
    for way in args.ways.split(","):
        steps = args.multi_worker_steps if way in MULTI_WORKER else args.steps
        with tempfile.TemporaryDirectory() as tmp:
            [summary] = collect(start_way(way, steps, Path(tmp), args.replays, plain=args.plain,
                                          samples=args.samples))
        summary["checks"] = checks(summary)
        rows.append(summary)
        print(json.dumps(summary), flush=True)
    print(table(rows))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
