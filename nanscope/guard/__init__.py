"""The guard: nanscope left on for a whole run, keeping it alive and saying why it intervened.

- `options`: what the guard does at a non-finite step or a loss spike (`GuardOptions`).
- `interventions`: every skip, rollback and stop, bounded, for the report and its JSON.
- `ring`: a bounded ring of earlier states on the host, taken every `snapshot_every` steps.
- `spikes`: a robust z-score over the last steps' loss and gradient norm.
- `verdicts`: whether the first non-finite step reproduces, and whether the batch or the state caused it.
- `state`: the variables the guard puts back (the step snapshot, the metrics, the learning rate).
- `guard`: `Guard`, which reads each step's record and acts.
"""

from nanscope.guard.options import MODES, ON_NONFINITE, GuardOptions, resolve_on_nonfinite

__all__ = ["MODES", "ON_NONFINITE", "GuardOptions", "resolve_on_nonfinite"]
