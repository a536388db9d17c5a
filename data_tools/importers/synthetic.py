"""Shared pieces of the synthetic generators (sbm, rmat): class-centred Gaussian features in row blocks."""
from __future__ import annotations

import numpy as np

from .common import FEATURE_BLOCK_BYTES


def class_centres(num_classes: int, feature_dim: int, seed: int) -> np.ndarray:
    """One random centre per class, each of unit expected norm (coordinates ~ N(0, 1/F))."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0xCE47]))
    return (rng.standard_normal((max(1, num_classes), feature_dim)) / np.sqrt(max(1, feature_dim))).astype(np.float32)


def gaussian_feature_blocks(labels: np.ndarray, feature_dim: int, noise: float, seed: int):
    """Factory of feature row blocks: x_v = centre[label_v] + noise * N(0, 1) per coordinate.

    Class centres have unit expected norm, so along the line joining two centres (distance ~sqrt(2))
    the noise has standard deviation ``noise`` whatever F: how separable a node's own features are does
    not depend on the feature dimension. Deterministic for a seed (blocks are drawn in order from one
    generator). Unlabelled nodes (-1) get pure noise.
    """
    n = len(labels)
    centres = class_centres(int(labels.max()) + 1 if n else 1, feature_dim, seed)
    step = max(1, FEATURE_BLOCK_BYTES // max(1, 4 * feature_dim))
    scale = np.float32(noise)

    def blocks():
        rng = np.random.default_rng(np.random.SeedSequence([seed, 0xFEA7]))
        for s in range(0, n, step):
            y = labels[s:s + step]
            x = rng.standard_normal((len(y), feature_dim), dtype=np.float32)
            x *= scale
            lab = y >= 0
            x[lab] += centres[y[lab]]
            yield s, x
    return blocks
