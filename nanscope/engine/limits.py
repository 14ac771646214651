"""The warning signs in a step's values: how large a layer's output may grow per dtype, what a loss spike is.

The rules warn past them (`bounded-activation`, `drop-outlier-rows`), and the step history
(nanscope/store/history.py) treats the first step past one as an event, so a long run keeps the
full rows around that warning's onset. They sit here, below both, so the history does not
import the rules.
"""

import math

import numpy as np

# A layer output whose square overflows breaks any MSE or L2 norm taken of it:
# sqrt(float32 max) ~ 1.8e19. float16's range is so small (max 65504) that a
# hundredth of it is already a warning sign.
ACTIVATION_LIMIT = {
    "float32": math.sqrt(float(np.finfo(np.float32).max)),
    "bfloat16": math.sqrt(float(np.finfo(np.float32).max)),
    "float16": float(np.finfo(np.float16).max) / 100,
    "float64": math.sqrt(float(np.finfo(np.float64).max)),
}


# A step whose loss is this many times the median of the SPIKE_WINDOW finite losses before it spiked.
SPIKE_FACTOR = 100.0
SPIKE_WINDOW = 20


def activation_limit(dtype: object) -> float:
    """The warning bound of a layer output computed in `dtype` (a dtype name); float32's for None or another name."""
    return ACTIVATION_LIMIT.get(str(dtype), ACTIVATION_LIMIT["float32"])
