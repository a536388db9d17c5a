"""``rmat`` generator: Graph500-style recursive-matrix (R-MAT) graphs.

N = 2**scale nodes, M = edge_factor * N directed edges u -> v. Each edge picks one quadrant of the
adjacency matrix per level with probabilities (a, b, c, d) = (0.57, 0.19, 0.19, 0.05), setting one bit of
u (c or d) and of v (b or d). As in the Graph500 reference generator the node labels are then scrambled
by a seeded random permutation, so high-degree nodes are not clustered at low IDs. Edges are generated
in blocks of vectorised numpy (one 16-bit uniform draw per edge per level), int32 (int64 from scale 31), and
handed to the CSR build block by block (``rmat_edge_blocks``): the edge list is never held whole unless the graph
is built in memory. Duplicate edges and self loops are kept unless --dedup / --self-loops drop;
the Graph500 kernel treats the graph as undirected: use --symmetrize for that.

Labels are uniform random in ``num_classes`` classes and features are class-centred Gaussians with the
same generator as sbm (``synthetic.gaussian_feature_blocks``), so a model can fit them from the features
alone (the structure carries no label information): enough to exercise training at scale.
"""
from __future__ import annotations

import numpy as np

from g3mpi.format import index_dtype

from .common import EDGE_CHUNK, EdgeStream, RawGraph, check_finite_nonneg, progress
from .synthetic import gaussian_feature_blocks

A, B, C, D = 0.57, 0.19, 0.19, 0.05


def _check(scale: int, edge_factor: int, probs) -> None:
    if not 1 <= scale <= 40:
        raise ValueError("--scale must be in [1, 40]")
    if edge_factor < 1:
        raise ValueError("--edge-factor must be >= 1")
    a, b, c = probs
    if not (min(a, b, c) >= 0 and a + b + c < 1):
        raise ValueError(f"R-MAT probabilities a, b, c must be >= 0 with a + b + c < 1 (got {probs})")


def _skip_draws(rng: np.random.Generator, num_uint32: int) -> None:
    """Advance ``rng`` (PCG64, fresh: no buffered half word) past ``num_uint32`` 32-bit draws, as the edge loop
    makes them (each ``integers(..., dtype=uint16)`` call of k values takes ceil(k / 2)): PCG64 hands out a 64-bit
    word in two halves, so an odd count leaves the upper half of the last word buffered."""
    bg = rng.bit_generator
    words, odd = divmod(num_uint32, 2)
    bg.advance(words)
    if odd:
        last = int(bg.random_raw())
        state = bg.state
        state["has_uint32"], state["uinteger"] = 1, last >> 32
        bg.state = state


def rmat_edge_blocks(scale: int, edge_factor: int, seed: int = 0, probs=(A, B, C), scramble: bool = True,
                     quiet: bool = False):
    """Factory of the R-MAT edges in blocks of EDGE_CHUNK: each call returns a fresh iterator of (src, dst), the
    same edges as :func:`rmat_edges` (one generator stream, read block by block). The scrambling permutation comes
    after every edge in that stream: a second generator skips ahead to it (:func:`_skip_draws`) and draws it
    first, so no block waits for the whole edge list."""
    _check(scale, edge_factor, probs)
    a, b, c = probs
    n = 1 << scale
    m = edge_factor * n
    idt = index_dtype(n)
    # 16-bit uniform draws against thresholds: probabilities quantised to 1/65536, 2.5x faster than floats
    fa, ab, abc = (np.uint16(round(p * 65536)) for p in (a, a + b, a + b + c))

    def new_rng():
        return np.random.default_rng(np.random.SeedSequence([seed, 0x12A7]))

    def blocks():
        perm = None
        if scramble:
            ahead = new_rng()
            full, rest = divmod(m, EDGE_CHUNK)
            _skip_draws(ahead, scale * (full * ((EDGE_CHUNK + 1) // 2) + (rest + 1) // 2))
            perm = ahead.permutation(n).astype(idt)
        rng = new_rng()
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
            yield (u, v) if perm is None else (perm[u], perm[v])
    return blocks


def rmat_edges(scale: int, edge_factor: int, seed: int = 0, probs=(A, B, C), scramble: bool = True,
               quiet: bool = False):
    """(src, dst) of edge_factor * 2**scale R-MAT edges; node IDs scrambled by a seeded permutation."""
    blocks = rmat_edge_blocks(scale, edge_factor, seed, probs, scramble, quiet)
    m = edge_factor << scale
    idt = index_dtype(1 << scale)
    src = np.empty(m, dtype=idt)
    dst = np.empty(m, dtype=idt)
    s = 0
    for u, v in blocks():
        src[s:s + len(u)] = u
        dst[s:s + len(v)] = v
        s += len(u)
    return src, dst


def generate_rmat(scale: int, edge_factor: int, feature_dim: int, *, num_classes: int = 16,
                  noise: float = 1.0, seed: int = 0, quiet: bool = False, relations: int = 0) -> RawGraph:
    """``relations`` R > 0: each edge gets a uniform random relation in [0, R) (a typed load for R-GCN; the
    edges are then held whole, as every typed graph is built in memory)."""
    if feature_dim < 1 or num_classes < 1:
        raise ValueError("--feature-dim and --classes must be >= 1")
    if relations < 0:
        raise ValueError("--relations must be >= 0")
    check_finite_nonneg("--noise", noise)
    edges = EdgeStream(edge_factor << scale, rmat_edge_blocks(scale, edge_factor, seed, quiet=quiet),
                       np.dtype(index_dtype(1 << scale)))
    n = 1 << scale
    labels = np.random.default_rng(np.random.SeedSequence([seed, 0x1ABE])).integers(0, num_classes, n)
    labels = labels.astype(np.int64)
    typed = {}
    if relations:
        typ = np.random.default_rng(np.random.SeedSequence([seed, 0x7E1A])).integers(0, relations, edges.num_edges)
        typed = dict(edge_type=typ.astype(np.int32), num_relations=int(relations))
    return RawGraph(path="rmat", num_nodes=n, src=None, dst=None, edges=edges, feature_dim=feature_dim,
                    feature_blocks=gaussian_feature_blocks(labels, feature_dim, noise, seed), labels=labels,
                    num_classes=num_classes, **typed,
                    source=f"rmat:scale={scale},ef={edge_factor},dim={feature_dim},classes={num_classes},seed={seed}"
                           + (f",relations={relations}" if relations else ""))
