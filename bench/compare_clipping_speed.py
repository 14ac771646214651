"""compare-clipping against the same strategies trained one after the other with `model.fit`.

`compare_clipping` with K=5 strategies (none, clipvalue, clipnorm, global_clipnorm,
auto) on configs/exploding-regression.yaml for `--steps` steps, against five
`model.fit` runs of the same configurations, each on a fresh compiled model, on the
same training rows, batch 32, for the same number of steps (fit does not stop at
NaN; compare-clipping stops a strategy at its first non-finite step, as a user
would). `auto` runs in fit as `global_clipnorm` at the auto threshold. Both sides
run in this one process; rounds are interleaved and the figure is the median.

Usage:
    .venv/bin/python bench/compare_clipping_speed.py              # --steps 1600 --rounds 3
"""

import argparse
import math
import os
import platform
import statistics

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import wall_seconds

from nanscope.run.clipping import compare_clipping
from nanscope.model.factory import load_callable
from nanscope.runtime import tensorflow
from nanscope.run.session import open_session
from nanscope.spec.load import apply_overrides, load_spec

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SPEC = REPO / "configs" / "exploding-regression.yaml"


def fit_configs(report):
    """Keras optimizer clip options equivalent to each compared strategy."""
    configs = {}
    for run in report.runs:
        kind, threshold = run.strategy.kind, run.strategy.threshold
        configs[run.strategy.name] = {} if kind == "none" else {
            "global_clipnorm" if kind in ("auto", "manual_clip_by_global_norm") else
            "clipnorm" if kind == "manual_clip_by_norm" else kind: threshold
        }
    return configs


def sequential_fit(spec, session, configs, steps):
    """Train a fresh compiled model per configuration with model.fit for `steps` steps."""
    _, keras = tensorflow()
    factory = load_callable(spec.model.factory, spec.base_dir, "model.factory", ValueError)
    x, y = session.train.x, session.train.y
    epochs = math.ceil(steps / session.order.steps_per_epoch)
    optimizer = spec.train.optimizer
    for clip in configs.values():
        keras.utils.set_random_seed(spec.train.seed)
        model = factory(**spec.model.args)
        model.compile(loss="mse", optimizer=keras.optimizers.SGD(
            learning_rate=optimizer.learning_rate, momentum=optimizer.model_extra.get("momentum", 0.0), **clip))
        model.fit(x, y, batch_size=spec.data.batch_size, epochs=epochs, steps_per_epoch=None, shuffle=True, verbose=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    spec = apply_overrides(load_spec(SPEC), steps=args.steps)
    session = open_session(spec)
    report = compare_clipping(spec, steps=args.steps)  # warm-up, and the thresholds fit should use
    configs = fit_configs(report)
    compare_times, fit_times = [], []
    for _ in range(args.rounds):
        compare_times.append(wall_seconds(lambda: compare_clipping(spec, steps=args.steps))[0])
        fit_times.append(wall_seconds(lambda: sequential_fit(spec, session, configs, args.steps))[0])
    ratios = [c / f for c, f in zip(compare_times, fit_times)]
    print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; {args.steps} steps, K={len(configs)}: "
          f"{', '.join(configs)}")
    per_epoch = session.order.steps_per_epoch
    print(f"steps run by compare-clipping: {sum(len(r.result.records) for r in report.runs)} "
          f"(fit: {len(configs) * math.ceil(args.steps / per_epoch) * per_epoch})")
    print(f"compare-clipping   median {statistics.median(compare_times):6.2f} s  "
          f"rounds {[f'{t:.2f}' for t in compare_times]}")
    print(f"sequential fit x{len(configs)} median {statistics.median(fit_times):6.2f} s  "
          f"rounds {[f'{t:.2f}' for t in fit_times]}")
    print(f"ratio compare/fit  median {statistics.median(ratios):.2f} (target <= 0.50)")


if __name__ == "__main__":
    main()
