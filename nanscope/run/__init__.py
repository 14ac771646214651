"""A run: the session (spec, data, model; seeded), trace-steps' step loop, the experiments
(--verify, compare-clipping) and the attribution of the first non-finite value."""
