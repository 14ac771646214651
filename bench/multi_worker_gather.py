"""What gathering every replica's row costs under `train.distribute: multi_worker`: 2 local workers against one process.

Runs the same spec three ways, each in its own processes, and times `engine.run` per step
(the compiled step, its host transfer and the record):

- **single**: one process, no strategy (`InstrumentedStep`);
- **2 workers, gathered**: two worker processes on 127.0.0.1 under MultiWorkerMirroredStrategy,
  the step trace-steps runs (`DistributedStep(workers=2)`: every replica's row rides the
  gradient all-reduce, in its own slot of a zero matrix);
- **2 workers, local only**: the same two processes, a step that all-reduces the gradients
  alone and returns only this worker's replicas' rows (`DistributedStep(workers=1)` under the
  same strategy); timed in rounds interleaved with the gathered step, so the difference is
  what gathering the rows costs.

Usage:
    .venv/bin/python bench/multi_worker_gather.py [--rounds 5] [--steps 100]
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
SPEC = {
    "model": {"factory": f"{Path(__file__).resolve()}:mlp"},
    "data": {"synthetic": {"kind": "classification", "samples": 4096, "features": 784, "classes": 10, "seed": 0},
             "batch_size": 128, "shuffle": False},
    "train": {"loss": "sparse_categorical_crossentropy", "optimizer": {"name": "adam", "learning_rate": 0.0001},
              "steps": 1000, "seed": 0},
}


def mlp():
    """Dense 256-256-10 on 784 inputs, as bench/trace_overhead.py's MLP."""
    import keras

    return keras.Sequential([keras.Input((784,)), keras.layers.Dense(256, activation="relu"),
                             keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10, activation="softmax")])


def timed(engines, session, rounds, steps):
    """Per engine name, the ms per step of each round; rounds interleave the engines."""
    from _common import interleaved_rounds

    batches = [session.batch(i) for i in range(4)]

    def runner(engine):
        return lambda i: engine.run(i, *batches[i % len(batches)])

    for engine in engines.values():  # traced and warm before timing
        for i in range(5):
            engine.run(i, *batches[i % len(batches)])
    return interleaved_rounds({name: runner(engine) for name, engine in engines.items()}, rounds, steps)


def role_main(args):
    from nanscope.run.session import open_session
    from nanscope.spec.load import parse_spec

    document = json.loads(Path(args.spec).read_text())
    if args.role == "single":
        session = open_session(parse_spec(document, source=args.spec))
        times = timed({"single": session.instrumented_step()}, session, args.rounds, args.steps)
    else:
        from nanscope.engine.distributed import DistributedStep
        from nanscope.model.optimizers import build_optimizer

        document["train"]["distribute"] = "multi_worker"
        session = open_session(parse_spec(document, source=args.spec))
        gathered = session.instrumented_step()
        with session.strategy.scope():
            optimizer = build_optimizer(session.spec, session.model, None)
        local = DistributedStep(session.strategy, session.model, session.loss, optimizer, *session.batch(0),
                                source=args.spec, workers=1)
        times = timed({"gathered": gathered, "local_only": local}, session, args.rounds, args.steps)
        times["row_floats"] = 6 + len(gathered.layers) * 6 + 3  # REPLICA_SCALARS, layer stats, counts, stop
    print(json.dumps(times))


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def run_role(spec, role, rounds, steps, env=None):
    command = [sys.executable, __file__, "--role", role, "--spec", spec, "--rounds", str(rounds), "--steps", str(steps)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})})


def result(process):
    out, err = process.communicate()
    if process.returncode != 0:
        raise SystemExit(err[-3000:])
    return json.loads(out.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--role", choices=["single", "worker"], default=None)
    parser.add_argument("--spec", default=None)
    args = parser.parse_args()
    if args.role:
        return role_main(args)
    from _common import median

    with tempfile.TemporaryDirectory() as folder:
        spec = str(Path(folder) / "bench.json")
        Path(spec).write_text(json.dumps(SPEC))
        single = result(run_role(spec, "single", args.rounds, args.steps))
        ports = free_ports(2)
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        workers = [run_role(spec, "worker", args.rounds, args.steps,
                            {"TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "worker", "index": t}})})
                   for t in range(2)]
        chief, _ = (result(w) for w in workers)
    rows = [("single process", median(single["single"])), ("2 workers, gathered", median(chief["gathered"])),
            ("2 workers, local only", median(chief["local_only"]))]
    extra = [g - lo for g, lo in zip(chief["gathered"], chief["local_only"])]
    print(f"MLP 784-256-256-10, batch 128, Adam; {args.rounds} rounds x {args.steps} steps; medians of rounds")
    for name, ms in rows:
        print(f"  {name:24s} {ms:8.3f} ms/step")
    print(f"  gathering the rows ({chief['row_floats']} floats a replica): {median(extra):+.3f} ms/step "
          f"(median of the rounds' differences); gathered / local only: {rows[1][1] / rows[2][1]:.2f}x; "
          f"gathered / single process: {rows[1][1] / rows[0][1]:.2f}x")


if __name__ == "__main__":
    main()
