"""Seeded synthetic datasets written with numpy.

The regression generator follows scikit-learn's `make_regression` (standard normal
features, `informative` of them weighted by 100 * U(0, 1), Gaussian noise on the
target), so its targets have the large, unnormalised scale that makes the classic
exploding-gradient example blow up. The classification generator places one Gaussian
cluster per class in the informative dimensions.
"""

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from nanscope.spec.sections import SyntheticSpec


def make_regression(samples: int, features: int, informative: int | None = None, noise: float = 0.1,
                    seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Return (x, y): float32 arrays of shape (samples, features) and (samples, 1)."""
    rng = np.random.default_rng(seed)
    informative = min(informative or max(1, features // 2), features)
    x = rng.standard_normal((samples, features))
    coef = np.zeros(features)
    coef[:informative] = 100.0 * rng.uniform(size=informative)
    y = x @ coef + noise * rng.standard_normal(samples)
    return x.astype(np.float32), y.reshape(-1, 1).astype(np.float32)


def make_classification(samples: int, features: int, classes: int = 2, informative: int | None = None,
                        noise: float = 0.1, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Return (x, y): float32 features and int32 labels in [0, classes)."""
    rng = np.random.default_rng(seed)
    informative = min(informative or max(1, features // 2), features)
    centers = 2.0 * rng.standard_normal((classes, informative))
    y = rng.integers(0, classes, size=samples)
    x = rng.standard_normal((samples, features))
    x[:, :informative] += centers[y]
    x += noise * rng.standard_normal(x.shape)
    return x.astype(np.float32), y.astype(np.int32)


def generate(synthetic: "SyntheticSpec") -> tuple[np.ndarray, np.ndarray]:
    """Arrays for a `SyntheticSpec`."""
    if synthetic.kind == "regression":
        return make_regression(
            synthetic.samples, synthetic.features, synthetic.informative, synthetic.noise, synthetic.seed
        )
    return make_classification(
        synthetic.samples, synthetic.features, synthetic.classes, synthetic.informative, synthetic.noise, synthetic.seed
    )
