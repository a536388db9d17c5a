"""The per-rank epoch cost model shared by the g3 partitioner, ``g3-inspect`` and the benchmark.

For part p of a partition, one GNN layer's forward pass costs about

    compute_p = edge_seconds * local_edges_p * width              (sparse aggregation)
    comm_p    = (halo_p + send_p) * width * value_bytes / bandwidth  (rows received + rows sent)
    layer_p   = compute_p + comm_p

and an epoch about ``2 * layers * layer_p`` (forward and backward move the same rows and touch the same
edges). The slowest rank sets the epoch time, so a partition is judged by ``max_p layer_p``. Note that
both terms scale with ``width``: the *ranking* of partitions does not depend on it, only the figures do.

``edge_seconds`` defaults to a figure measured on the development machine and can be measured on the
target with :func:`calibrate` (``g3-partition --calibrate``); ``bandwidth`` comes from ``--bandwidth``.
All statistics are computed vectorised from the graph's in-edge CSR and a node→part assignment.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

#: seconds per (edge x feature) of a single-threaded scipy CSR SpMM (1.3e-9 .. 3.4e-9 measured on the
#: development machine for widths 128 .. 16)
DEFAULT_EDGE_SECONDS = 2.0e-9
#: 10 Gbit/s in bytes per second
DEFAULT_BANDWIDTH = 10e9 / 8


@dataclass(frozen=True)
class CostModel:
    """Coefficients of the epoch-time estimate (see the module docstring)."""

    edge_seconds: float = DEFAULT_EDGE_SECONDS
    bandwidth: float = DEFAULT_BANDWIDTH   # bytes / s
    width: int = 128                       # values per row moved / aggregated
    value_bytes: int = 4                   # float32
    layers: int = 2

    def layer_costs(self, local_edges, comm_rows) -> tuple[np.ndarray, np.ndarray]:
        """(compute seconds, communication seconds) of one layer's forward pass, per part."""
        compute = self.edge_seconds * np.asarray(local_edges, dtype=float) * self.width
        comm = np.asarray(comm_rows, dtype=float) * self.width * self.value_bytes / self.bandwidth
        return compute, comm

    def epoch_costs(self, local_edges, comm_rows) -> np.ndarray:
        c, m = self.layer_costs(local_edges, comm_rows)
        return 2 * self.layers * (c + m)

    def layer_bytes(self, comm_rows) -> np.ndarray:
        return np.asarray(comm_rows, dtype=np.int64) * self.width * self.value_bytes

    def to_dict(self) -> dict:
        return asdict(self)


def calibrate(width: int = 64, num_nodes: int = 200_000, degree: int = 16, repeats: int = 5, seed: int = 0) -> float:
    """Measure seconds per (edge x feature) of a CSR SpMM (scipy, this process) on a random graph."""
    import scipy.sparse as sp   # (here, not at import: every waiting rank of g3-partition imports this module)
    rng = np.random.default_rng(seed)
    e = num_nodes * degree
    rows = np.repeat(np.arange(num_nodes), degree)
    cols = rng.integers(0, num_nodes, e)
    a = sp.csr_matrix((np.ones(e, np.float32), (rows, cols)), shape=(num_nodes, num_nodes))
    x = rng.standard_normal((num_nodes, width), dtype=np.float32)
    a @ x  # warm up
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        a @ x
        best = min(best, time.perf_counter() - t)
    return best / (a.nnz * width)


def out_edges(indptr: np.ndarray, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(src, dst) arrays of every in-edge of a CSR whose row v lists the sources of edges into v."""
    n = len(indptr) - 1
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
    return np.asarray(indices, dtype=np.int64), dst


def replica_matrix(src: np.ndarray, dst: np.ndarray, assignment: np.ndarray, num_parts: int) -> "scipy.sparse.csr_matrix":
    """M[u, q] = number of edges from u into nodes of part q (N x P sparse, int32)."""
    import scipy.sparse as sp
    n = len(assignment)
    m = sp.coo_matrix((np.ones(len(src), dtype=np.int32), (src, assignment[dst])), shape=(n, num_parts)).tocsr()
    m.sum_duplicates()
    return m


def partition_stats(src: np.ndarray, dst: np.ndarray, assignment: np.ndarray, num_parts: int,
                    in_degree: np.ndarray | None = None) -> dict:
    """Per-part owned nodes, local edges, halo rows, send rows, neighbours, cut edges (self loops excluded).

    halo_q = distinct nodes outside q with an edge into q; send_p = sum over nodes u of p of the number of
    other parts u has an edge into. Exactly what ``data_tools.build`` writes into the part files.
    """
    a = np.asarray(assignment, dtype=np.int64)
    n, P = len(a), num_parts
    if in_degree is None:
        in_degree = np.bincount(dst, minlength=n)
    owned = np.bincount(a, minlength=P)
    local_edges = np.bincount(a, weights=in_degree, minlength=P).astype(np.int64)
    m = replica_matrix(src, dst, a, P)
    rows = np.repeat(np.arange(n, dtype=np.int64), np.diff(m.indptr))
    cols = m.indices.astype(np.int64)
    remote = cols != a[rows]
    ru, rq = rows[remote], cols[remote]
    rp = a[ru]
    halo = np.bincount(rq, minlength=P)
    send = np.bincount(rp, minlength=P)
    cut = np.bincount(rq, weights=m.data[remote], minlength=P).astype(np.int64)
    link = np.zeros((P, P), dtype=bool)
    link[rp, rq] = True
    neighbors = (link | link.T).sum(axis=1)
    return dict(owned=owned, local_edges=local_edges, halo=halo, send=send, recv=halo, cut_edges=cut,
                neighbors=neighbors)


def imbalance(a) -> float:
    a = np.asarray(a, dtype=float)
    return float(a.max() / a.mean()) if len(a) and a.mean() > 0 else 1.0


def quality(stats: dict, model: CostModel) -> dict:
    """Totals of :func:`partition_stats` plus the cost model's estimate."""
    comm = stats["halo"] + stats["send"]
    cost = model.epoch_costs(stats["local_edges"], comm)
    n = int(stats["owned"].sum())
    return dict(edge_cut=int(stats["cut_edges"].sum()), replication_factor=float(1 + stats["halo"].sum() / max(1, n)),
                node_imbalance=imbalance(stats["owned"]), compute_imbalance=imbalance(stats["local_edges"]),
                comm_imbalance=imbalance(comm), max_comm_rows=int(comm.max()) if len(comm) else 0,
                total_comm_rows=int(comm.sum()), est_max_epoch_seconds=float(cost.max()) if len(cost) else 0.0,
                est_mean_epoch_seconds=float(cost.mean()) if len(cost) else 0.0)
