"""Turn a graph plus a node→part assignment into a partition directory (meta.json, node_map.h5, part files).

Every partitioner (metis, random, g3) ends here, so relabelling and the per-part layout live in one place.
All steps are vectorised numpy: no Python loop over nodes or edges.
"""
from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np

from g3mpi.format import (FORMAT_VERSION, PARTITION_FORMAT, FormatError, Graph, PartData, atomic_dir, index_dtype,
                          part_name, write_meta, write_node_map, write_part)
from g3mpi.format.partition import NODE_MAP_NAME

from .partitioners.metis import strip_self_loops


def relabel(assignment: np.ndarray, num_parts: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New IDs grouped by part (stable within a part). Returns (new_to_orig, orig_to_new, offsets[P+1])."""
    new_to_orig = np.argsort(assignment, kind="stable").astype(np.int64)
    orig_to_new = np.empty_like(new_to_orig)
    orig_to_new[new_to_orig] = np.arange(len(new_to_orig), dtype=np.int64)
    counts = np.bincount(assignment, minlength=num_parts)
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return new_to_orig, orig_to_new, offsets


def permute_csr(indptr, indices, new_to_orig, orig_to_new):
    """CSR of the relabelled graph: row i is old row new_to_orig[i], columns mapped and sorted per row."""
    deg = np.diff(indptr)[new_to_orig]
    new_indptr = np.zeros(len(deg) + 1, dtype=np.int64)
    np.cumsum(deg, out=new_indptr[1:])
    # gather position of every edge of the new row order
    starts = np.repeat(indptr[:-1][new_to_orig] - new_indptr[:-1], deg)
    pos = starts + np.arange(new_indptr[-1], dtype=np.int64)
    cols = orig_to_new[indices[pos]]
    rows = np.repeat(np.arange(len(deg), dtype=np.int64), deg)
    order = np.lexsort((cols, rows))
    return new_indptr, cols[order]


def build_parts(g: Graph, assignment: np.ndarray, num_parts: int, partition_id: str):
    """Yield (PartData, new_to_orig, offsets) pieces: one PartData per part, built from the whole graph."""
    n = g.num_nodes
    assignment = np.asarray(assignment, dtype=np.int64)
    if assignment.shape != (n,) or (n and (assignment.min() < 0 or assignment.max() >= num_parts)):
        raise ValueError(f"assignment must give every node a part in [0, {num_parts})")
    indices = g.indices.astype(np.int64)
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.indptr))
    loops = np.bincount(dst[indices == dst], minlength=n).astype(np.int64)   # per original ID
    del dst
    indptr, indices, _ = strip_self_loops(g.indptr, indices)
    new_to_orig, orig_to_new, offsets = relabel(assignment, num_parts)
    indptr, cols = permute_csr(indptr, indices, new_to_orig, orig_to_new)
    in_deg = np.diff(indptr)
    out_deg = np.bincount(cols, minlength=n).astype(np.int64)

    owner = np.repeat(np.arange(num_parts, dtype=np.int64), np.diff(offsets))
    halos = []
    for p in range(num_parts):
        s, e = int(offsets[p]), int(offsets[p + 1])
        c = cols[indptr[s]:indptr[e]]
        halos.append(np.unique(c[(c < s) | (c >= e)]))
    # send lists: what part q needs from part p, in the order of q's halo slice for p
    sends = [dict() for _ in range(num_parts)]
    for q, h in enumerate(halos):
        own = owner[h]
        bounds = np.searchsorted(own, np.arange(num_parts + 1))
        for p in np.nonzero(np.diff(bounds))[0]:
            sends[p][q] = h[bounds[p]:bounds[p + 1]] - offsets[p]

    for p in range(num_parts):
        s, e = int(offsets[p]), int(offsets[p + 1])
        no = e - s
        h = halos[p]
        c = cols[indptr[s]:indptr[e]]
        inside = (c >= s) & (c < e)
        local = np.where(inside, c - s, no + np.searchsorted(h, c))
        own_h = owner[h]
        recv_parts, recv_counts = np.unique(own_h, return_counts=True)
        recv_offsets = np.zeros(len(recv_parts) + 1, dtype=np.int64)
        np.cumsum(recv_counts, out=recv_offsets[1:])
        sp = sorted(sends[p])
        send_rows = np.concatenate([sends[p][q] for q in sp]) if sp else np.zeros(0, dtype=np.int64)
        send_offsets = np.zeros(len(sp) + 1, dtype=np.int64)
        np.cumsum([len(sends[p][q]) for q in sp], out=send_offsets[1:])
        rows_all = np.concatenate([np.arange(s, e, dtype=np.int64), h])
        orig = new_to_orig[s:e]
        yield PartData(
            part_id=p, num_parts=num_parts, num_nodes=n, num_edges=int(indptr[-1]),
            feature_dim=g.features.shape[1], num_classes=int(g.attrs["num_classes"]), owned_start=s, owned_end=e,
            partition_id=partition_id,
            indptr=(indptr[s:e + 1] - indptr[s]).astype(np.int64), indices=local.astype(index_dtype(no + len(h))),
            halo_ids=h.astype(np.int64), recv_parts=recv_parts.astype(np.int32), recv_offsets=recv_offsets,
            send_parts=np.asarray(sp, dtype=np.int32), send_offsets=send_offsets,
            send_rows=send_rows.astype(np.int64), in_degree=in_deg[rows_all], out_degree=out_deg[rows_all],
            self_loops=loops[orig],
            features=np.ascontiguousarray(g.features[orig], dtype=np.float32), labels=g.labels[orig].astype(np.int64),
            train_mask=g.train_mask[orig], val_mask=g.val_mask[orig], test_mask=g.test_mask[orig], orig_ids=orig,
        ), new_to_orig, offsets


def part_stats(part: PartData) -> dict:
    """Per-part quality figures (cheap, from the part alone)."""
    return dict(part=part.part_id, owned=part.num_owned, local_edges=int(part.indptr[-1]),
                halo=part.num_halo, send=int(len(part.send_rows)), recv=part.num_halo,
                recv_neighbors=int(len(part.recv_parts)), send_neighbors=int(len(part.send_parts)),
                neighbors=int(len(np.union1d(part.recv_parts, part.send_parts))),
                train=int(part.train_mask.sum()))


def summarize(stats: list[dict], num_nodes: int, num_edges: int) -> dict:
    """Totals over parts: edge cut, replication factor, imbalances, max communication rows."""
    P = len(stats)
    le = np.array([s["local_edges"] for s in stats], dtype=float)
    comm = np.array([s["halo"] + s["send"] for s in stats], dtype=float)
    owned = np.array([s["owned"] for s in stats], dtype=float)
    halo = sum(s["halo"] for s in stats)
    # each edge whose source lives on another part is cut exactly once (it sits in exactly one part's CSR)
    cut = int(sum(s.get("cut_edges", 0) for s in stats))

    def imb(a):
        return float(a.max() / a.mean()) if len(a) and a.mean() > 0 else 1.0
    return dict(num_nodes=num_nodes, num_edges=num_edges, num_parts=P, edge_cut=cut,
                replication_factor=float(1 + halo / max(1, num_nodes)), node_imbalance=imb(owned),
                compute_imbalance=imb(le), comm_imbalance=imb(comm), max_comm_rows=int(comm.max()) if P else 0,
                total_halo=int(halo))


def cut_edges(part: PartData) -> int:
    return int((part.indices >= part.num_owned).sum())


def write_partition(g: Graph, assignment: np.ndarray, num_parts: int, out_dir, *, method: str, seed: int | None,
                    force: bool = False, extra_meta: dict | None = None, progress=None) -> dict:
    """Write a whole partition directory atomically (temp dir, then rename). Returns meta.json's content."""
    out_dir = Path(out_dir)
    t0 = time.time()
    partition_id = uuid.uuid4().hex
    files, stats = {}, []
    with atomic_dir(out_dir, force) as tmp:
        it = build_parts(g, assignment, num_parts, partition_id)
        for part, new_to_orig, offsets in (progress(it, total=num_parts) if progress else it):
            files[part_name(part.part_id)] = write_part(tmp / part_name(part.part_id), part)
            st = part_stats(part)
            st["cut_edges"] = cut_edges(part)
            stats.append(st)
        if num_parts and not stats:
            raise FormatError(out_dir, "no parts were written")
        files[NODE_MAP_NAME] = write_node_map(tmp / NODE_MAP_NAME, new_to_orig)
        meta = dict(format=PARTITION_FORMAT, version=FORMAT_VERSION, num_parts=num_parts, method=method, seed=seed,
                    partition_id=partition_id, num_nodes=g.num_nodes, num_edges=int(sum(s["local_edges"] for s in stats)),
                    num_edges_input=g.num_edges, feature_dim=int(g.features.shape[1]),
                    num_classes=int(g.attrs["num_classes"]), graph_source=str(g.attrs.get("source", "")),
                    offsets=[int(o) for o in offsets], files=files,
                    quality=summarize(stats, g.num_nodes, int(sum(s["local_edges"] for s in stats))),
                    parts=stats, build_seconds=round(time.time() - t0, 3))
        meta.update(extra_meta or {})
        write_meta(tmp, meta)
    return meta
