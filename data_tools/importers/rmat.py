"""``rmat`` generator: Graph500-style recursive-matrix (R-MAT) graphs.

N = 2**scale nodes, M = edge_factor * N directed edges u -> v. Each edge picks one quadrant of the
adjacency matrix per level with probabilities (a, b, c, d) = (0.57, 0.19, 0.19, 0.05), setting one bit of
u (c or d) and of v (b or d). As in the Graph500 reference generator the node labels are then scrambled
by a seeded random permutation, so high-degree nodes are not clustered at low IDs. Edges are generated
in chunks of vectorised numpy (one 16-bit uniform draw per edge per level) straight into preallocated int32
arrays (int64 from scale 31). Duplicate edges and self loops are kept unless --dedup / --self-loops drop;
the Graph500 kernel treats the graph as undirected: use --symmetrize for that.

Labels are uniform random in ``num_classes`` classes and features are class-centred Gaussians with the
same generator as sbm (``synthetic.gaussian_feature_blocks``), so a model can fit them from the features
alone (the structure carries no label information): enough to exercise training at scale.
"""
from __future__ import annotations

import numpy as np

from g3mpi.format import index_dtype

from .common import EDGE_CHUNK, RawGraph, check_finite_nonneg, progress
from .synthetic import gaussian_feature_blocks

A, B, C, D = 0.57, 0.19, 0.19, 0.05


def rmat_edges(scale: int, edge_factor: int, seed: int = 0, probs=(A, B, C), scramble: bool = True,
               quiet: bool = False):
    """(src, dst) of edge_factor * 2**scale R-MAT edges; node IDs scrambled by a seeded permutation."""
    if not 1 <= scale <= 40:
        raise ValueError("--scale must be in [1, 40]")
    if edge_factor < 1:
        raise ValueError("--edge-factor must be >= 1")
    a, b, c = probs
    if not (min(a, b, c) >= 0 and a + b + c < 1):
        raise ValueError(f"R-MAT probabilities a, b, c must be >= 0 with a + b + c < 1 (got {probs})")
    n = 1 << scale
    m = edge_factor * n
    idt = index_dtype(n)
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x12A7]))
    src = np.empty(m, dtype=idt)
    dst = np.empty(m, dtype=idt)
    # 16-bit uniform draws against thresholds: probabilities quantised to 1/65536, 2.5x faster than floats
    fa, ab, abc = (np.uint16(round(p * 65536)) for p in (a, a + b, a + b + c))
    for s in progress(range(0, m, EDGE_CHUNK), desc="rmat edges", disable=True if quiet else None):
        k = min(EDGE_CHUNK, m - s)
        u = np.zeros(k, dtype=idt)
        v = np.zeros(k, dtype=idt)
        for _ in range(scale):                      # one level per bit, most significant first
            r = rng.integers(0, 1 << 16, size=k, dtype=np.uint16)
            ubit = r >= ab                          # quadrants c, d: lower half (source bit set)
            vbit = (r >= fa) ^ ubit                 # quadrant b: [a, a+b) ...
            vbit |= r >= abc                        # ... or d: right half (target bit set)
            u <<= 1
            u |= ubit
            v <<= 1
            v |= vbit
        src[s:s + k] = u
        dst[s:s + k] = v
    if not scramble:
        return src, dst
    perm = rng.permutation(n).astype(idt)
    for s in range(0, m, EDGE_CHUNK):
        src[s:s + EDGE_CHUNK] = perm[src[s:s + EDGE_CHUNK]]
        dst[s:s + EDGE_CHUNK] = perm[dst[s:s + EDGE_CHUNK]]
    return src, dst


def generate_rmat(scale: int, edge_factor: int, feature_dim: int, *, num_classes: int = 16,
                  noise: float = 1.0, seed: int = 0, quiet: bool = False) -> RawGraph:
    if feature_dim < 1 or num_classes < 1:
        raise ValueError("--feature-dim and --classes must be >= 1")
    check_finite_nonneg("--noise", noise)
    src, dst = rmat_edges(scale, edge_factor, seed, quiet=quiet)
    n = 1 << scale
    labels = np.random.default_rng(np.random.SeedSequence([seed, 0x1ABE])).integers(0, num_classes, n)
    labels = labels.astype(np.int64)
    return RawGraph(path="rmat", num_nodes=n, src=src, dst=dst, feature_dim=feature_dim,
                    feature_blocks=gaussian_feature_blocks(labels, feature_dim, noise, seed), labels=labels,
                    num_classes=num_classes,
                    source=f"rmat:scale={scale},ef={edge_factor},dim={feature_dim},classes={num_classes},seed={seed}")
