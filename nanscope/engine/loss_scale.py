"""When dynamic loss scaling has stopped training: updates that keep being skipped, not a scale below 1.

Keras 3's LossScaleOptimizer (keras/src/optimizers/loss_scale_optimizer.py) halves its
scale and skips the update whenever the scaled gradients are not finite, and doubles it
after `dynamic_growth_steps` good steps. The scale has no floor: gradients that overflow
float16 unscaled (raw inputs in the thousands) train at a scale of 0.125, with updates
applied. Occasional skips are how it works; what stops training is updates that stop
being applied (keras#16100), so that, and not the scale's value, is what is judged.
"""

from collections import deque
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nanscope.engine.records import StepRecord

# Skipped updates in a window this long, at this fraction, are a collapsed loss scale,
# not the occasional overflow that dynamic loss scaling expects.
SKIP_WINDOW = 5
SKIP_FRACTION_LIMIT = 0.8
# The window looks at the last SKIP_WINDOW * 4 updates that had gradients.
RECENT_UPDATES = SKIP_WINDOW * 4
# The scale starts at 2^15 and halves on every skip, so a run of skips at the start is its
# warm-up, not a problem: gradients that overflow float16 unscaled need it to go below 1
# (raw inputs near 3000 skip 18 times, down to 0.125, then train). Thirty halvings try every
# scale from 2^15 down to 2^-15; a gradient that is still not finite at 2^-15 would be
# above 65504 * 2^15 ~ 2e9 unscaled: no scale fits it, and no weight has changed for 30 steps.
WARM_UP_SKIPS = 30
# The phases of a step that went non-finite before any gradient existed: its update was
# skipped as a consequence, not by loss scaling.
BEFORE_GRADIENTS = ("data", "forward", "loss")


def collapsed_window(skipped: np.ndarray, scaled: np.ndarray, before_gradients: np.ndarray) -> np.ndarray | None:
    """The steps (indices) over which a LossScaleOptimizer skipped so many updates that training stalled; None if it
    did not.

    Args:
        skipped: bool array, per step. The update was skipped.
        scaled: bool array. The step scaled its loss (a LossScaleOptimizer was in use).
        before_gradients: bool array. The step went non-finite before any gradient existed: its update was
            skipped as a consequence, not by loss scaling, and does not count.
    """
    considered = _after_warm_up(np.flatnonzero(scaled & ~before_gradients), skipped)
    window = considered[-RECENT_UPDATES:]
    if len(window) < SKIP_WINDOW or skipped[window].sum() / len(window) < SKIP_FRACTION_LIMIT:
        return None
    return window


def _after_warm_up(considered: np.ndarray, skipped: np.ndarray) -> np.ndarray:
    """The steps `considered` (indices) less the LossScaleOptimizer's warm-up: the run of skipped updates it starts
    with while it halves its scale down from 2^15. A warm-up that reached WARM_UP_SKIPS steps is kept, ended or not:
    by then no weight had changed for that long."""
    flags = skipped[considered]
    warm_up = int(np.argmin(flags)) if not flags.all() else len(considered)
    if warm_up >= WARM_UP_SKIPS:
        return considered
    return considered[:0] if warm_up == len(considered) else considered[warm_up:]


class LossScaleWatch:
    """Marks, as records arrive, the skipped update at which the loss scale has collapsed (`collapsed_window` over
    the steps so far holds): from there on a skipped update is the failure, not loss scaling at work.

    Example:
        watch = LossScaleWatch()
        for record in records:
            watch.see(record)     # sets record.scale_collapsed; record.phase then says "backward"
    """

    def __init__(self) -> None:
        self.warm_up = 0            # skips before the first applied update (the whole run while none applied)
        self.trained = False        # an update was applied
        self.recent: deque[bool] = deque(maxlen=RECENT_UPDATES)

    def see(self, record: "StepRecord") -> None:
        """Take the next record in step order; mark it when its skipped update is one of a collapsed scale."""
        if not record.loss_scale or record.phase in BEFORE_GRADIENTS:
            return
        skipped = bool(record.update_skipped)
        self.recent.append(skipped)
        if not self.trained and skipped:
            self.warm_up += 1
            collapsed = self.warm_up >= WARM_UP_SKIPS
        else:
            if not self.trained and self.warm_up < WARM_UP_SKIPS:
                self.recent = deque([skipped], maxlen=RECENT_UPDATES)  # a warm-up that ended in time does not count
            self.trained = True
            collapsed = len(self.recent) >= SKIP_WINDOW and sum(self.recent) / len(self.recent) >= SKIP_FRACTION_LIMIT
        record.scale_collapsed = skipped and collapsed
