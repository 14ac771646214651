"""Timing helpers shared by the benchmarks: interleaved rounds, medians of ratios.

Timing variants one after another lets a drift in the machine (another process,
CPU frequency, a warm cache) land on one variant only. Interleaving them (every
round times each variant in turn) and taking the median of per-round ratios
against a baseline keeps such drift out of the ratio.
"""

import statistics
import time


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def seconds_per_call(fn, calls, clock="wall"):
    """Mean seconds of `fn(i)` over `calls` calls, i = 0 .. calls-1.

    `clock` is "wall" (elapsed time) or "cpu" (CPU time of this process, all its
    threads): on a machine shared with other work the CPU time moves less.
    """
    now = CLOCKS[clock]
    start = now()
    for i in range(calls):
        fn(i)
    return (now() - start) / calls


def interleaved_rounds(variants, rounds, calls, clock="wall"):
    """Per variant, the ms per call of each round; every round times every variant in turn.

    Args:
        variants: dict of name -> callable(i). One call is one unit of work (a train step).
        rounds: int. Rounds; the variants run in the same order in each.
        calls: int. Calls per variant per round.
        clock: str, default "wall". "wall" or "cpu", see `seconds_per_call`.

    Returns:
        dict of name -> list of float, ms per call, one entry per round.
    """
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(1000.0 * seconds_per_call(fn, calls, clock))
    return times


def median_ratio(times, name, baseline):
    """Median over rounds of times[name][r] / times[baseline][r]."""
    return statistics.median(a / b for a, b in zip(times[name], times[baseline]))


def median(values):
    """The median of a non-empty sequence of numbers."""
    return statistics.median(values)


def wall_seconds(fn, clock="wall"):
    """(seconds, result) of one call of `fn()`, by the wall or the CPU clock (see `seconds_per_call`)."""
    now = CLOCKS[clock]
    start = now()
    result = fn()
    return now() - start, result
