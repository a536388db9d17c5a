"""Turn a graph plus a node→part assignment into a partition directory (meta.json, node_map.h5, part files).

Every partitioner (metis, random, g3) ends here, so relabelling and the per-part layout live in one place.
All steps are vectorised numpy: no Python loop over nodes or edges.
"""
from __future__ import annotations

import dataclasses
import time
import uuid
from pathlib import Path

import numpy as np

from g3mpi.format import (PARTITION_FORMAT, PARTITION_VERSION, FormatError, Graph, PartData, atomic_dir, index_dtype,
                          open_graph, owner_of, part_name, write_meta, write_node_map, write_part)
from g3mpi.format.graph import link_counts
from g3mpi.format.errors import failure_reason
from g3mpi.format.features import feature_dtype_attr, stored_dtype, widen
from g3mpi.format.limits import LargeFeatures, check_finite_features
from g3mpi.format.partition import META_NAME, NODE_MAP_NAME, PartFeatures
from g3mpi.format.schema import labels_dtype
from g3mpi.mpi.termination import raise_if_terminated

from .layout import boundary_first_order, graph_order_keys


def relabel(assignment: np.ndarray, num_parts: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """New IDs grouped by part, boundary-first within a part (``keys``: :func:`data_tools.layout.order_keys`).
    Returns (new_to_orig, orig_to_new, offsets[P+1])."""
    new_to_orig = boundary_first_order(assignment, keys)
    orig_to_new = np.empty_like(new_to_orig)
    orig_to_new[new_to_orig] = np.arange(len(new_to_orig), dtype=np.int64)
    counts = np.bincount(assignment, minlength=num_parts)
    offsets = np.zeros(num_parts + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    return new_to_orig, orig_to_new, offsets


#: edges gathered and sorted at a time while a part's CSR is built: bounds its temporaries (about 40 bytes per
#: edge of a block) whatever the size of the graph or of its largest part. The degrees' pass takes
#: max(BLOCK_EDGES, N) edges at a time (its bincounts are N long anyway)
BLOCK_EDGES = 1 << 22


def row_blocks(deg: np.ndarray, block_edges: int = BLOCK_EDGES) -> np.ndarray:
    """Boundaries [0, ..., len(deg)] of consecutive row ranges holding about ``block_edges`` edges each (a row
    with more edges than that is a range of its own)."""
    ends = np.cumsum(deg)
    if len(ends) == 0 or ends[-1] <= block_edges:
        return np.array([0, len(deg)], dtype=np.int64)
    cuts = np.searchsorted(ends, np.arange(block_edges, ends[-1], block_edges), side="left") + 1
    return np.unique(np.concatenate([[0], np.minimum(cuts, len(deg)), [len(deg)]])).astype(np.int64)


def degrees(indptr: np.ndarray, indices: np.ndarray, block_edges: int = BLOCK_EDGES):
    """(self loops, in-degree without them, out-degree without them) per node of a CSR of in-edges, by row blocks."""
    n = len(indptr) - 1
    deg = np.diff(indptr)
    loops = np.zeros(n, dtype=np.int64)
    out_deg = np.zeros(n, dtype=np.int64)
    # at least n edges per block: each block's bincount of the out-degrees costs O(n)
    b = row_blocks(deg, max(block_edges, n))
    # the row IDs in a dtype that holds them: a graph file's indices may be any integer type (load_graph checks
    # only their range), and rows past its range would wrap (uint8: row 256 becomes a self loop of node 0)
    dtype = index_dtype(n)
    for lo, hi in zip(b[:-1], b[1:]):
        src = np.asarray(indices[indptr[lo]:indptr[hi]])
        if src.dtype != dtype and src.dtype != np.int64:
            src = src.astype(np.int64 if src.dtype.itemsize > dtype.itemsize else dtype)
        dst = np.repeat(np.arange(lo, hi, dtype=src.dtype), deg[lo:hi])
        loop = src == dst
        loops[lo:hi] = np.bincount(dst[loop] - lo, minlength=hi - lo)
        out_deg += np.bincount(src[~loop], minlength=n)
    return loops, deg - loops, out_deg


def part_csr(indptr, indices, rows: np.ndarray, first: int, orig_to_new: np.ndarray,
             block_edges: int = BLOCK_EDGES, edge_type: np.ndarray | None = None):
    """CSR of the relabelled graph restricted to one part's rows, without self loops.

    ``rows``: the part's original node IDs in new-ID order (new IDs ``first, first + 1, ...``). Returns
    (indptr [len(rows)+1] int64, columns as new IDs, sorted within each row, dtype of ``orig_to_new``). Rows are
    gathered and sorted ``block_edges`` edges at a time. With ``edge_type`` (the graph's relation of each edge), a
    third value: the relation of each returned edge, rows sorted by source then relation."""
    deg = np.diff(indptr)[rows]
    b = row_blocks(deg, block_edges)
    cols, counts, types = [], [], []
    for lo, hi in zip(b[:-1], b[1:]):
        d = deg[lo:hi]
        starts = np.repeat(indptr[rows[lo:hi]] - np.cumsum(d) + d, d)   # original offset of each row's first edge
        pos = starts + np.arange(int(d.sum()), dtype=np.int64)
        c = orig_to_new[indices[pos]]
        t = edge_type[pos] if edge_type is not None else None
        del starts, pos
        r = np.repeat(np.arange(first + lo, first + hi, dtype=c.dtype), d)
        keep = c != r
        c, r = c[keep], r[keep]
        if t is not None:
            t = t[keep]
            order = np.lexsort((t, c, r))
            cols.append(c[order])
            types.append(t[order])
        else:
            cols.append(sort_within_rows(c, r))
        counts.append(np.bincount(r - (first + lo), minlength=hi - lo))
        del c, r, keep
    out_indptr = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.concatenate(counts) if counts else np.zeros(0, np.int64), out=out_indptr[1:])
    out_cols = (np.concatenate(cols) if len(cols) > 1 else cols[0] if cols
                else np.zeros(0, dtype=orig_to_new.dtype))
    if edge_type is None:
        return out_indptr, out_cols
    return out_indptr, out_cols, (np.concatenate(types) if types else np.zeros(0, dtype=edge_type.dtype))


def sort_within_rows(cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``cols`` (non-negative) sorted within each run of equal ``rows`` (non-decreasing): ``cols[np.lexsort((cols,
    rows))]``, by one sort of a combined int64 key (5-10x faster than lexsort on millions of edges)."""
    if len(cols) == 0:
        return cols.copy()
    r0, width = int(rows[0]), int(cols.max()) + 1
    if (int(rows[-1]) - r0 + 1) * width >= 2 ** 62:
        return cols[np.lexsort((cols, rows))]
    base = (rows - r0).astype(np.int64)
    base *= width
    key = base + cols
    # numpy's stable sort (timsort) follows runs: a row's new IDs are a few increasing runs (the boundary-first
    # order keeps the original order within each group of a part), 3.6x faster than the default on R-MAT 20
    key.sort(kind="stable")
    key -= base
    return key.astype(cols.dtype)


def localize(cols: np.ndarray, s: int, e: int, block: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(local indices, halo) of a part owning new IDs [s, e): owned columns become 0..e-s-1, the others
    e-s + their rank in the sorted halo (the distinct columns outside [s, e)). ``block``: columns handled at
    once (None: all), bounding the temporaries; the result is the same. A table over the IDs up to the largest
    column (5 bytes each, no more than the serial writer's own per-node arrays) maps them in two passes."""
    block = max(1, block or len(cols))
    pieces = [cols[a:a + block] for a in range(0, len(cols), block)]
    n = int(cols.max()) + 1 if len(cols) else 0
    seen = np.zeros(n, dtype=bool)
    for c in pieces:
        seen[c] = True
    seen[s:min(e, n)] = False
    halo = np.flatnonzero(seen).astype(np.int64)
    del seen
    dt = index_dtype(e - s + len(halo))
    table = np.empty(n, dtype=dt)
    table[s:min(e, n)] = np.arange(min(e, n) - s if n > s else 0, dtype=dt)
    table[halo] = np.arange(e - s, e - s + len(halo), dtype=dt)
    local = np.empty(len(cols), dtype=dt)
    for a, c in zip(range(0, len(cols), block), pieces):
        local[a:a + len(c)] = table[c]
    return local, halo


def graph_feature_dim(g: Graph) -> int:
    """F, whether the features are in memory or left in the file."""
    return int(g.attrs["feature_dim"]) if g.features is None else int(g.features.shape[1])


def exchange_lists(halo_owner: np.ndarray, sends: dict) -> dict:
    """A part's receive and send lists (PartData's ``recv_*`` and ``send_*``): ``halo_owner`` is the owning part
    of each halo row (ascending), ``sends`` maps each part q to the owned rows q needs, in the order of q's halo
    slice for this part."""
    recv_parts, recv_counts = np.unique(halo_owner, return_counts=True)
    recv_offsets = np.zeros(len(recv_parts) + 1, dtype=np.int64)
    np.cumsum(recv_counts, out=recv_offsets[1:])
    sp = sorted(sends)
    send_rows = np.concatenate([sends[q] for q in sp]) if sp else np.zeros(0, dtype=np.int64)
    send_offsets = np.zeros(len(sp) + 1, dtype=np.int64)
    np.cumsum([len(sends[q]) for q in sp], out=send_offsets[1:])
    # boundary-first (data_tools.layout): the rows of the send lists are the owned rows 0 .. num_boundary-1
    num_boundary = int(send_rows.max()) + 1 if len(send_rows) else 0
    return dict(recv_parts=recv_parts.astype(np.int32), recv_offsets=recv_offsets,
                send_parts=np.asarray(sp, dtype=np.int32), send_offsets=send_offsets,
                send_rows=send_rows.astype(np.int64), num_boundary=num_boundary)


#: most threads building parts' CSRs at once (each holds one block's temporaries, about 40 B per edge of
#: :data:`BLOCK_EDGES`)
MAX_BUILD_THREADS = 4


def build_parts(g: Graph, assignment: np.ndarray, num_parts: int, partition_id: str, threads: int = 1,
                degrees_of_g: tuple | None = None):
    """Yield (PartData, new_to_orig, offsets) pieces: one PartData per part, built from the whole graph.

    Memory: one pass over the graph for the degrees, then each part's CSR built from its own rows (in blocks of
    :data:`BLOCK_EDGES` edges) and kept as local indices (the graph's edges once more, at 4 bytes each when a
    part has under 2**31 rows) until every halo is known; the send lists need all of them. Labels and masks are
    gathered one part at a time as it is written, and so are the features if ``g`` holds them; if
    ``g.features`` is None, every PartData has ``features=None`` (see :func:`stream_features`).

    ``threads``: parts whose CSRs are built at once (numpy's gathers and sorts release the GIL: on 2 cores the
    CSRs of R-MAT 22's 8 parts took 0.6x the time of one thread). ``degrees_of_g``: :func:`degrees` of ``g``
    when the caller has them."""
    n = g.num_nodes
    assignment = np.asarray(assignment, dtype=np.int64)
    if assignment.shape != (n,) or (n and (assignment.min() < 0 or assignment.max() >= num_parts)):
        raise ValueError(f"assignment must give every node a part in [0, {num_parts})")
    loops, in_deg, out_deg = degrees_of_g or degrees(g.indptr, g.indices, BLOCK_EDGES)
    keys = graph_order_keys(g.indptr, g.indices, assignment, num_parts,
                            row_blocks(np.diff(g.indptr), max(BLOCK_EDGES, n)),
                            symmetric=bool(g.attrs.get("symmetric", False)))
    new_to_orig, orig_to_new, offsets = relabel(assignment, num_parts, keys)
    del keys
    orig_to_new = orig_to_new.astype(index_dtype(n))
    num_edges = int(in_deg.sum())
    feature_dim = graph_feature_dim(g)

    def one_part(p):
        s, e = int(offsets[p]), int(offsets[p + 1])
        ip, cols, *t = part_csr(g.indptr, g.indices, new_to_orig[s:e], s, orig_to_new, BLOCK_EDGES, g.edge_type)
        local, h = localize(cols, s, e)
        return (ip, local, t[0] if t else None), h

    links = part_links(g.links, orig_to_new, offsets, num_parts)

    threads = max(1, min(int(threads), MAX_BUILD_THREADS, num_parts))
    if threads == 1:
        built = [one_part(p) for p in range(num_parts)]
    else:
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(threads, thread_name_prefix="g3-build") as pool:
            built = list(pool.map(one_part, range(num_parts)))
    csrs, halos = [b[0] for b in built], [b[1] for b in built]
    del built, orig_to_new

    owner = np.repeat(np.arange(num_parts, dtype=np.int64), np.diff(offsets))
    # send lists: what part q needs from part p, in the order of q's halo slice for p
    sends = [dict() for _ in range(num_parts)]
    for q, h in enumerate(halos):
        own = owner[h]
        bounds = np.searchsorted(own, np.arange(num_parts + 1))
        for p in np.nonzero(np.diff(bounds))[0]:
            sends[p][q] = h[bounds[p]:bounds[p + 1]] - offsets[p]

    for p in range(num_parts):
        s, e = int(offsets[p]), int(offsets[p + 1])
        h = halos[p]
        ip, local, types = csrs[p]
        csrs[p] = halos[p] = None     # released as soon as the part is written
        lists = exchange_lists(owner[h], sends[p])
        sends[p] = None
        orig = new_to_orig[s:e]
        orig_all = np.concatenate([orig, new_to_orig[h]])
        yield PartData(
            part_id=p, num_parts=num_parts, num_nodes=n, num_edges=num_edges,
            feature_dim=feature_dim, num_classes=int(g.attrs["num_classes"]), owned_start=s, owned_end=e,
            partition_id=partition_id,
            indptr=ip, indices=local,
            halo_ids=h, **lists, in_degree=in_deg[orig_all], out_degree=out_deg[orig_all],
            self_loops=loops[orig],
            features=None if g.features is None else np.ascontiguousarray(g.features[orig]),   # as stored
            labels=g.labels[orig].astype(labels_dtype(g.labels.ndim)),
            train_mask=g.train_mask[orig], val_mask=g.val_mask[orig], test_mask=g.test_mask[orig], orig_ids=orig,
            feature_dtype=g.feature_dtype, num_relations=g.num_relations,
            edge_type=None if types is None else types.astype(np.int32 if g.num_relations < 2**31 else np.int64),
            links=links[p], num_node_types=g.num_node_types,
            node_type=None if g.node_type is None else g.node_type[orig_all].astype(np.int32),
        ), new_to_orig, offsets


def part_links(links: dict | None, orig_to_new: np.ndarray, offsets: np.ndarray, num_parts: int) -> list[dict]:
    """Each part's link arrays (docs/FORMAT.md): the pairs and shared negatives of every split whose source it
    owns, by new global IDs, in the order of the graph's split, with their positions in it (``*_index``); the
    relation and negative targets of each of its pairs."""
    from g3mpi.format.links import SPLITS, link_name
    out = [dict() for _ in range(num_parts)]
    for s in SPLITS:
        for pairs, index, rows_of in (("edge", "edge_index", ("edge_type", "target_node_neg")),
                                      ("edge_neg", "edge_neg_index", ())):
            a = (links or {}).get(link_name(s, pairs))
            if a is None:
                continue
            new = orig_to_new[a].astype(np.int64)
            owner = owner_of(offsets, new[:, 0]) if len(new) else np.zeros(0, np.int64)
            order = np.argsort(owner, kind="stable")
            bounds = np.searchsorted(owner[order], np.arange(num_parts + 1))
            extra = {k: links[link_name(s, k)] for k in rows_of if link_name(s, k) in links}
            for p in range(num_parts):
                sel = order[bounds[p]:bounds[p + 1]]
                out[p][link_name(s, pairs)] = new[sel]
                out[p][link_name(s, index)] = sel.astype(np.int64)
                for k, v in extra.items():
                    v = v[sel]
                    out[p][link_name(s, k)] = orig_to_new[v].astype(np.int64) if k == "target_node_neg" else v
    return out


#: graph rows read at a time when the features are copied from the graph file into the part files
FEATURE_BLOCK_BYTES = 64 << 20
#: part files filled at a time (each pass over the graph's features fills this many: open HDF5 files)
FEATURE_GROUP = 64


def feature_rows(graph_path, ds, lo: int, hi: int, large: LargeFeatures | None = None) -> np.ndarray:
    """Rows ``lo:hi`` of the graph file's features dataset ``ds`` as stored (float32, float16 or bfloat16's
    uint16: copied into the parts unconverted), checked finite when ``large`` is given (FormatError naming the
    graph otherwise), which also counts the rows too large for float32 training; FormatError if they cannot be
    read."""
    name = feature_dtype_attr(graph_path, ds.file.attrs.get("feature_dtype", "float32"))
    try:
        raw = np.asarray(ds[lo:hi])
    except OSError as e:   # the file changed since it was validated
        raise FormatError(graph_path, f"features rows {lo}..{hi - 1} cannot be read: {e}") from None
    if large is not None:
        with np.errstate(over="ignore"):
            wide = widen(raw, name)
        if not np.isfinite(large.scan(wide, lo)):   # (one pass when they are finite)
            check_finite_features(graph_path, raw if name != "bfloat16" else wide, lo,
                                  note=": the runtime would refuse the parts")
    with np.errstate(over="ignore"):
        return raw.astype(stored_dtype(name), copy=False)     # (a float64 dataset of a float32 graph: narrowed)


def small_features(graph_path, large: LargeFeatures) -> np.ndarray | None:
    """The graph file's whole features as stored (checked as :func:`stream_features` checks them) if they take
    at most :data:`FEATURE_BLOCK_BYTES`, the block that streaming them would read at a time anyway; else None.
    Held in memory, each part's rows are written with the part itself: at 1024 parts of Cora, opening and
    closing every part file a second time to fill its features was a tenth of the whole write."""
    with open_graph(graph_path) as f:
        ds = f["features"]
        n, width = ds.shape
        if n * ds.dtype.itemsize * width > FEATURE_BLOCK_BYTES:
            return None
        return feature_rows(graph_path, ds, 0, n, large)


def stream_features(graph_path, part_paths: list, new_to_orig: np.ndarray, offsets: np.ndarray,
                    large: LargeFeatures) -> list[str]:
    """Copy the features from ``graph_path`` into part files written without them, reading the graph's rows in
    blocks of about :data:`FEATURE_BLOCK_BYTES` (never the whole matrix): part p's rows are
    ``new_to_orig[offsets[p]:offsets[p+1]]``, increasing within each key group of the boundary-first order, so a
    block fills a few runs of rows of each part. Parts are filled :data:`FEATURE_GROUP` at a time, one pass over
    the graph per group; the first pass checks the rows (``large``: :func:`feature_rows`). Returns each part
    file's sha256."""
    shas = []
    with open_graph(graph_path) as f:
        ds = f["features"]
        n, width = ds.shape
        step = max(1, FEATURE_BLOCK_BYTES // max(1, ds.dtype.itemsize * width))
        for g0 in range(0, len(part_paths), FEATURE_GROUP):
            group = range(g0, min(g0 + FEATURE_GROUP, len(part_paths)))
            by_orig = {p: np.argsort(new_to_orig[offsets[p]:offsets[p + 1]]) for p in group}   # local rows
            rows = {p: new_to_orig[offsets[p]:offsets[p + 1]][by_orig[p]] for p in group}       # increasing
            writers = {p: PartFeatures(part_paths[p]) for p in group}
            try:
                for lo in range(0, n, step):
                    hi = min(n, lo + step)
                    block = feature_rows(graph_path, ds, lo, hi, large if g0 == 0 else None)
                    for p in group:
                        a, b = np.searchsorted(rows[p], (lo, hi))
                        if b > a:
                            pos = by_orig[p][a:b]
                            order = np.argsort(pos)
                            writers[p].put(pos[order], block[rows[p][a:b][order] - lo])
                shas += [writers.pop(p).close() for p in group]
            finally:
                for w in writers.values():
                    w.close_on_error()
    return shas


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
                    force: bool = False, extra_meta: dict | None = None, progress=None, graph_path=None,
                    threads: int = 1, degrees: tuple | None = None) -> dict:
    """Write a whole partition directory atomically (temp dir, then rename). Returns meta.json's content.
    ``threads``: parts built at once; ``degrees``: the graph's, when the caller has them (:func:`build_parts`).

    If ``g.features`` is None (``load_graph(..., features=False)``) they are copied from ``graph_path`` block by
    block once the other datasets are written (:func:`stream_features`)."""
    if g.features is None and graph_path is None:
        raise ValueError("the graph's features are not in memory: give graph_path to read them from")
    out_dir = Path(out_dir)
    try:
        return _write_partition(g, assignment, num_parts, out_dir, method, seed, force, extra_meta, progress,
                                graph_path, threads, degrees)
    except (OSError, RuntimeError) as e:   # h5py reports a failed flush (a full disk) as a RuntimeError
        raise OutputWriteError(out_dir, f"cannot be written: {failure_reason(e)}") from None


class OutputWriteError(FormatError):
    """The partition directory could not be written (a full disk, a file size limit, permissions); nothing of it
    is left. h5py may crash while tearing down the files of such a write: a command ends at once after it."""


def _write_partition(g, assignment, num_parts, out_dir, method, seed, force, extra_meta, progress, graph_path,
                     threads, degs):
    t0 = time.time()
    partition_id = uuid.uuid4().hex
    large = LargeFeatures()   # (features in memory were checked by whoever read them, e.g. load_graph)
    if g.features is None:
        features = small_features(graph_path, large)
        if features is not None:   # written with each part; else streamed once the parts are written
            g = dataclasses.replace(g, features=features)
    files, stats = {}, []
    with atomic_dir(out_dir, META_NAME, force) as tmp:
        it = build_parts(g, assignment, num_parts, partition_id, threads, degs)
        for part, new_to_orig, offsets in (progress(it, total=num_parts) if progress else it):
            files[part_name(part.part_id)] = write_part(tmp / part_name(part.part_id), part, atomic=False)
            st = part_stats(part)
            st["cut_edges"] = cut_edges(part)
            stats.append(st)
        if num_parts and not stats:
            raise FormatError(out_dir, "no parts were written")
        if g.features is None:
            names = [part_name(p) for p in range(num_parts)]
            for name, sha in zip(names, stream_features(graph_path, [tmp / x for x in names], new_to_orig, offsets,
                                                        large)):
                files[name] = sha
        files[NODE_MAP_NAME] = write_node_map(tmp / NODE_MAP_NAME, new_to_orig)
        local_edges = int(sum(s["local_edges"] for s in stats))
        meta = dict(format=PARTITION_FORMAT, version=PARTITION_VERSION, num_parts=num_parts, method=method, seed=seed,
                    partition_id=partition_id, num_nodes=g.num_nodes, num_edges=local_edges,
                    num_edges_input=g.num_edges, feature_dim=graph_feature_dim(g), feature_dtype=g.feature_dtype,
                    num_classes=int(g.attrs["num_classes"]), graph_source=str(g.attrs.get("source", "")),
                    offsets=[int(o) for o in offsets], files=files,
                    quality=summarize(stats, g.num_nodes, local_edges),
                    parts=stats, build_seconds=round(time.time() - t0, 3))
        if g.num_relations:
            meta["num_relations"] = g.num_relations
            if g.relation_names is not None:
                meta["relation_names"] = g.relation_names
        if g.links:
            meta["links"] = link_counts(g.links)
        if g.num_node_types:
            meta["num_node_types"] = g.num_node_types
            if g.node_type_names is not None:
                meta["node_type_names"] = g.node_type_names
            if g.node_type_feature_dim is not None:
                meta["node_type_feature_dim"] = [int(x) for x in g.node_type_feature_dim]
        meta.update(extra_meta or {})
        write_meta(tmp, meta)
        raise_if_terminated()   # a SIGTERM whose exception was lost in a callback: do not commit the directory
    large.warn(graph_path, g.orig_ids)
    return meta
