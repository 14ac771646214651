"""Timing helpers shared by the benchmarks: interleaved rounds, medians of ratios.

Timing variants one after another lets a drift in the machine (another process,
CPU frequency, a warm cache) land on one variant only. Interleaving them (every
round times each variant in turn) and taking the median of per-round ratios
against a baseline keeps such drift out of the ratio.
"""

import statistics
import time


def seconds_per_call(fn, calls):
    """Mean wall-clock seconds of `fn(i)` over `calls` calls, i = 0 .. calls-1."""
    start = time.perf_counter()
    for i in range(calls):
        fn(i)
    return (time.perf_counter() - start) / calls


def interleaved_rounds(variants, rounds, calls):
    """Per variant, the ms per call of each round; every round times every variant in turn.

    Args:
        variants: dict of name -> callable(i). One call is one unit of work (a train step).
        rounds: int. Rounds; the variants run in the same order in each.
        calls: int. Calls per variant per round.

    Returns:
        dict of name -> list of float, ms per call, one entry per round.
    """
    times = {name: [] for name in variants}
    for _ in range(rounds):
        for name, fn in variants.items():
            times[name].append(1000.0 * seconds_per_call(fn, calls))
    return times


def median_ratio(times, name, baseline):
    """Median over rounds of times[name][r] / times[baseline][r]."""
    return statistics.median(a / b for a, b in zip(times[name], times[baseline]))


def median(values):
    """The median of a non-empty sequence of numbers."""
    return statistics.median(values)


def wall_seconds(fn):
    """(seconds, result) of one call of `fn()`."""
    start = time.perf_counter()
    result = fn()
    return time.perf_counter() - start, result
