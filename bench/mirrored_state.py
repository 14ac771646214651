"""What keeping the guard's state costs per step under `train.distribute: mirrored` (2 logical CPUs).

Times `engine.run` per step (the compiled step, its host transfer and the record) of
trace-steps' `DistributedStep` on bench/multi_worker_gather.py's MLP (784-256-256-10,
batch 128, Adam), two ways, in interleaved rounds, each with its own optimizer:

- **weights**: the step as trace-steps runs it without a guard (the weights copied before
  the update, for the forensic replay);
- **guard**: the step under a guard (`--on-nonfinite skip|rollback`, a ring): the optimizer's
  variables (Adam's counter and two slots) copied too (`keep_optimizer_state`).

Run it against two checkouts to compare them (PYTHONPATH picks the nanscope it imports).

Usage:
    .venv/bin/python bench/mirrored_state.py [--rounds 7] [--steps 100] [--clock cpu]
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("NANSCOPE_CPU_REPLICAS", "2")  # before nanscope starts TensorFlow
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import CLOCKS, interleaved_rounds, median, median_ratio  # noqa: E402
from multi_worker_gather import SPEC  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = parser.parse_args()

    from nanscope.run.session import open_session
    from nanscope.spec.load import parse_spec

    document = json.loads(json.dumps(SPEC))
    document["model"]["factory"] = f"{HERE / 'multi_worker_gather.py'}:mlp"
    document["train"]["distribute"] = "mirrored"
    with tempfile.TemporaryDirectory() as folder:
        session = open_session(parse_spec(document, source=str(Path(folder) / "bench.json")))
    weights, guard = session.instrumented_step(), session.instrumented_step()
    guard.keep_optimizer_state()  # before it is traced, as trace-steps' guard does
    batches = [session.batch(i) for i in range(4)]
    engines = {"weights": weights, "guard": guard}
    for engine in engines.values():  # traced and warm before timing
        for i in range(5):
            engine.run(i, *batches[i % len(batches)])
    times = interleaved_rounds({name: (lambda e: lambda i: e.run(i, *batches[i % len(batches)]))(engine)
                                for name, engine in engines.items()}, args.rounds, args.steps, args.clock)
    print(f"MLP 784-256-256-10, batch 128, Adam, MirroredStrategy over {session.strategy.num_replicas_in_sync} "
          f"devices; {args.rounds} rounds x {args.steps} steps, {args.clock} clock; medians of rounds")
    for name in engines:
        print(f"  {name:8s} {median(times[name]):8.3f} ms/step  (rounds: "
              f"{', '.join(f'{t:.2f}' for t in times[name])})")
    print(f"  guard / weights: {median_ratio(times, 'guard', 'weights'):.3f}x (median of the rounds' ratios)")


if __name__ == "__main__":
    main()
