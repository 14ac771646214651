"""The finite steps of a run, as the rules read them: every one's scalars, and the full rows kept of them.

`StepHistory.healthy()` (nanscope/store/history.py) picks them out of every step's scalars
(the steps whose phase is 0) and of the bounded set of full rows it keeps.
"""

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Healthy:
    """The finite steps of a run, for the rules: every one's scalars, and the full rows kept of them.

    Args:
        steps, loss, grad_norm, update_ratio, weight_norm: np.ndarray, one entry per finite step.
        records: list of StepRecord. The kept full rows of finite steps, in step order.
    """

    steps: np.ndarray
    loss: np.ndarray
    grad_norm: np.ndarray
    update_ratio: np.ndarray
    weight_norm: np.ndarray
    records: list = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.steps)
