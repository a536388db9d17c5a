"""Write a partition directory from ranks that each hold a slice of the graph and its nodes' parts.

The parallel twin of :func:`data_tools.build.build_parts`: the same relabelling (new IDs grouped by part,
boundary-first within a part: ``data_tools.layout``) and the same part files, but no rank holds the whole graph.
Part p is written by rank ``p % R``: every rank sends it the rows of its slice that part p owns (new IDs,
relabelled in-edges without self loops, degrees, labels, masks, features; Alltoallv), the writer builds the local
CSR and halo
(:func:`~data_tools.build.localize`), and asks the writers of the halo's owners for the halo's degrees; those
requests are the owners' send lists. Rank 0 writes ``node_map.h5`` from the parts' original IDs, received in part
order one part at a time, and ``meta.json``.
"""
from __future__ import annotations

import json
import time
from contextlib import ExitStack

import numpy as np
from mpi4py import MPI

from g3mpi.format import (PARTITION_FORMAT, PARTITION_VERSION, FormatError, PartData, index_dtype, part_name,
                          write_meta, write_part)
from g3mpi.format.errors import failure_reason
from g3mpi.format.features import stored_dtype
from g3mpi.format.partition import NODE_MAP_NAME, NodeMapWriter, PartRows, owner_of
from g3mpi.mpi.collectives import agree, allgather_rows, allreduce, alltoallv, as_watchdog, exchange_counts
from g3mpi.mpi.termination import raise_if_terminated
from g3mpi.sorting import merge_unique, sorted_unique

from .build import exchange_lists, part_stats, sort_within_rows, summarize
from .layout import ranks_of_groups, slice_order_keys
from .partitioners.stream import BLOCK_EDGES, row_blocks
from .slices import GraphSlice, SliceFeatures

#: message tag of the parts' original IDs sent to rank 0 for the node map
NODE_MAP_TAG = 31
#: the phase those messages name when a rank stops answering
NODE_MAP_WAIT = "hand-off of the parts' original IDs to rank 0 (node_map.h5)"
#: features of one block of rows written at a time (with :data:`BLOCK_EDGES` edges at most): a writer holds a
#: block about three times over (received, put in new-ID order, and each sender's share of it) while writing it
FEATURE_BLOCK_BYTES = 1 << 24


def relabel_local(comm, own_parts: np.ndarray, P: int, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(new IDs of this rank's rows, offsets [P+1]): part p owns new IDs offsets[p]..offsets[p+1]-1, boundary-first
    by ``keys`` (:func:`data_tools.layout.order_keys`), then in original order: the order of the serial writer."""
    sizes = allreduce(comm, np.bincount(own_parts, minlength=P).astype(np.int64))
    offsets = np.zeros(P + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return ranks_of_groups(comm, own_parts.astype(np.int64) * (P * P + 1) + keys), offsets


class OwnRows:
    """This rank's rows as the part files see them: new IDs, relabelled in-edges without self loops sorted by new
    ID within a row, the global degrees without self loops, self loops. Built :data:`BLOCK_EDGES` edges at a time
    (``cols`` int32 where the IDs fit)."""

    def __init__(self, comm, sl: GraphSlice, lg, new_ids: np.ndarray, block_edges: int = BLOCK_EDGES):
        n_own = sl.num_rows
        self.feature_dtype = sl.attrs.get("feature_dtype", "float32")   # the features' stored dtype, kept
        deg = np.diff(sl.indptr)
        all_new = np.concatenate([new_ids, lg.plan.pull(new_ids)]).astype(index_dtype(sl.num_nodes))
        self.loops = np.zeros(n_own, dtype=np.int64)
        out_all = np.zeros(n_own + len(lg.ghosts), dtype=np.int64)
        self.cols = np.empty(len(sl.indices), dtype=all_new.dtype)     # (self loops aside: trimmed below)
        at = 0
        for a, b in row_blocks(sl.indptr, block_edges):
            rows = np.repeat(np.arange(a, b, dtype=np.int64), deg[a:b])
            gid = sl.indices[sl.indptr[a]:sl.indptr[b]]
            loop = gid == rows + sl.lo
            self.loops[a:b] = np.bincount(rows[loop] - a, minlength=b - a)
            # local column of every source (own row or ghost; the ghosts hold every source outside the slice)
            inside = (gid >= sl.lo) & (gid < sl.hi)
            local = np.where(inside, gid - sl.lo, 0)
            local[~inside] = n_own + np.searchsorted(lg.ghosts, gid[~inside])
            local, rows = local[~loop], rows[~loop]
            out_all += np.bincount(local, minlength=len(out_all))
            c = all_new[local]
            self.cols[at:at + len(c)] = sort_within_rows(c, rows)
            at += len(c)
        self.in_deg = deg - self.loops
        self.out_deg = out_all[:n_own].copy()
        lg.plan.push_add(out_all[n_own:], self.out_deg)
        self.cols = self.cols[:at] if at < len(self.cols) else self.cols
        self.row_len = self.in_deg.copy()
        self.new_ids = new_ids


def gather_rows(ptr: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Positions of the entries of ``rows`` (in that order) in a CSR with row pointer ``ptr``."""
    d = ptr[rows + 1] - ptr[rows]
    return np.repeat(ptr[rows] - np.cumsum(d) + d, d) + np.arange(int(d.sum()), dtype=np.int64)


def gather_values(ptr: np.ndarray, rows: np.ndarray, values: np.ndarray, block_edges: int = BLOCK_EDGES):
    """``values[gather_rows(ptr, rows)]``, the positions made :data:`BLOCK_EDGES` at a time."""
    d = ptr[rows + 1] - ptr[rows]
    out = np.empty(int(d.sum()), dtype=values.dtype)
    cuts = np.searchsorted(np.cumsum(d), np.arange(block_edges, len(out), block_edges), side="left").tolist()
    at = 0
    for a, b in zip([0, *cuts], [*cuts, len(rows)]):
        v = values[gather_rows(ptr, rows[a:b])]
        out[at:at + len(v)] = v
        at += len(v)
    return out


def shuffle(comm, sl: GraphSlice, own: OwnRows, own_parts: np.ndarray) -> dict:
    """Every row's per-node fields to the writer of its part (rank ``part % R``); returns the rows this rank
    writes, sorted by new ID: ``new_ids, orig, in_deg, out_deg, loops, labels, masks`` and their CSR row pointer
    ``ptr``; ``orig`` and the degrees as :func:`compact` integers (the part files hold them as int64:
    :func:`build_my_parts` widens one part's at a time). The edges and features follow block by block as the
    parts are written (:func:`fill_parts`)."""
    R = comm.size
    dest = own_parts % R
    order = np.lexsort((own_parts, dest))          # by writer, then part; original order within a part
    counts = np.bincount(dest, minlength=R).astype(np.int64)
    rc = exchange_counts(comm, counts)
    # received grouped by source rank; sorted by new ID, a part's rows are contiguous and in original order
    got_ids = alltoallv(comm, own.new_ids[order], counts, rc)
    by_new = np.argsort(got_ids, kind="stable")
    got = dict(new_ids=got_ids[by_new])
    del got_ids
    small = compact(max(sl.num_nodes, sl.num_edges))
    fields = dict(orig=np.arange(sl.lo, sl.hi, dtype=small), in_deg=own.in_deg, out_deg=own.out_deg,
                  loops=own.loops, labels=sl.labels, row_len=own.row_len, **sl.masks)
    for k in list(fields):
        send = np.asarray(fields.pop(k))[order]
        if k in ("in_deg", "out_deg", "loops", "row_len"):
            send = send.astype(small, copy=False)
        got[k] = alltoallv(comm, send, counts, rc)[by_new]
        del send
    got["ptr"] = np.zeros(len(by_new) + 1, dtype=np.int64)
    np.cumsum(got.pop("row_len"), out=got["ptr"][1:])
    return got


def compact(largest: int) -> type:
    """int32 for per-node integers up to ``largest`` (IDs, degrees) where they fit, else int64: a writer holds
    them for every node of its parts until they are written (R-MAT 23 into 2 parts: 4.2M nodes a writer)."""
    return np.int32 if largest < 2 ** 31 else np.int64


def part_halos(comm, own: OwnRows, own_parts: np.ndarray, offsets: np.ndarray, P: int,
               block_edges: int = BLOCK_EDGES) -> dict:
    """{part: halo} of the parts this rank writes (the distinct sources outside the part of its rows' in-edges,
    sorted): every rank sends each writer the distinct outside sources of its rows in each part, keyed
    ``part * N + source``, found :data:`BLOCK_EDGES` edges at a time."""
    R, n = comm.size, int(offsets[-1])
    ptr = np.zeros(len(own.row_len) + 1, dtype=np.int64)
    np.cumsum(own.row_len, out=ptr[1:])
    keys = np.zeros(0, dtype=np.int64)
    for a, b in row_blocks(ptr, block_edges):
        p = np.repeat(own_parts[a:b], own.row_len[a:b])
        c = own.cols[ptr[a]:ptr[b]]
        out = (c < offsets[p]) | (c >= offsets[p + 1])
        # merged block by block: the distinct pairs only, never every block's pairs at once
        keys = merge_unique(keys, sorted_unique(p[out] * n + c[out]))
    dest = (keys // max(1, n)) % R
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=R).astype(np.int64)
    got = sorted_unique(alltoallv(comm, keys[order], counts, exchange_counts(comm, counts)))
    del keys, order
    cut = np.searchsorted(got, np.arange(P + 1, dtype=np.int64) * n)
    return {p: got[cut[p]:cut[p + 1]] - p * n for p in my_parts(comm, P)}


def my_parts(comm, P: int) -> list[int]:
    return list(range(comm.rank, P, comm.size))


def build_my_parts(comm, sl: GraphSlice, rows: dict, halos: dict, offsets: np.ndarray, P: int, partition_id: str,
                   num_edges: int):
    """Yield the PartData of every part this rank writes, without its ``indices`` and ``features`` (None; written
    by :func:`fill_parts`). The halo degrees and send lists are exchanged collectively first, so the yields need
    no communication."""
    R = comm.size
    mine = my_parts(comm, P)
    pos_of = rows["new_ids"]                      # sorted: the rows of my parts, by new ID
    # requests for the halo's degrees, to the writers of their owners; they are the owners' send lists
    req_q = np.concatenate([np.full(len(halos[p]), p, dtype=np.int64) for p in mine]) if mine else np.zeros(0, np.int64)
    req_id = np.concatenate([halos[p] for p in mine]) if mine else np.zeros(0, np.int64)
    dest = owner_of(offsets, req_id) % R
    order = np.argsort(dest, kind="stable")
    counts = np.bincount(dest, minlength=R).astype(np.int64)
    rc = exchange_counts(comm, counts)
    in_q = alltoallv(comm, req_q[order], counts, rc)
    in_id = alltoallv(comm, req_id[order], counts, rc)
    at = np.searchsorted(pos_of, in_id)
    deg = np.stack([rows["in_deg"][at], rows["out_deg"][at]], axis=1)
    back = np.empty((len(req_id), 2), dtype=deg.dtype)
    back[order] = alltoallv(comm, deg, rc, counts)
    halo_deg, done = {}, 0
    for p in mine:
        halo_deg[p] = back[done:done + len(halos[p])]
        done += len(halos[p])
    owner_p = owner_of(offsets, in_id)
    sends = {p: {} for p in mine}
    s_order = np.lexsort((in_id, in_q, owner_p))
    for p, q, ids in _groups(owner_p[s_order], in_q[s_order], in_id[s_order]):
        sends[p][q] = ids - offsets[p]
    n, F = sl.num_nodes, int(sl.attrs["feature_dim"])
    for p in mine:
        s, e = int(offsets[p]), int(offsets[p + 1])
        a, b = np.searchsorted(pos_of, (s, e))
        ptr = rows["ptr"][a:b + 1]
        ip = ptr if ptr[0] == 0 else ptr - ptr[0]
        h = halos[p]
        lists = exchange_lists(owner_of(offsets, h), sends.pop(p))
        hd = halo_deg.pop(p)
        # the part file's integer datasets are int64, the form the rows are written from (the same files)
        yield PartData(
            part_id=p, num_parts=P, num_nodes=n, num_edges=num_edges, feature_dim=F,
            num_classes=int(sl.attrs["num_classes"]), owned_start=s, owned_end=e, partition_id=partition_id,
            indptr=ip, indices=None, halo_ids=h, **lists,
            in_degree=np.concatenate([rows["in_deg"][a:b], hd[:, 0]], dtype=np.int64),
            out_degree=np.concatenate([rows["out_deg"][a:b], hd[:, 1]], dtype=np.int64),
            self_loops=rows["loops"][a:b].astype(np.int64), features=None,
            labels=rows["labels"][a:b], train_mask=rows["train_mask"][a:b], val_mask=rows["val_mask"][a:b],
            test_mask=rows["test_mask"][a:b], orig_ids=rows["orig"][a:b].astype(np.int64),
            feature_dtype=sl.attrs.get("feature_dtype", "float32"))
        del hd


def _groups(p: np.ndarray, q: np.ndarray, ids: np.ndarray):
    """(p, q, ids) for each run of equal (p, q) in the sorted pairs."""
    if not len(p):
        return
    cut = np.flatnonzero((np.diff(p) != 0) | (np.diff(q) != 0)) + 1
    for a, b in zip(np.concatenate([[0], cut]), np.concatenate([cut, [len(p)]])):
        yield int(p[a]), int(q[a]), ids[a:b]


def write_parts(comm, tmp, sl: GraphSlice, own: OwnRows, rows: dict, halos: dict, offsets: np.ndarray, P: int,
                partition_id: str, num_edges: int, **blocks) -> tuple[dict, list]:
    """Write this rank's part files into ``tmp``: each without its edges and features first, which then come
    in blocks (:func:`fill_parts`); returns ({file: sha256}, [part stats]). Every rank arrives at the agreement
    after its writes, failed or not (RankFailed on every rank if one failed). ``blocks``: :func:`write_blocks`'
    sizes."""
    stats, err = {}, None
    for part in build_my_parts(comm, sl, rows, halos, offsets, P, partition_id, num_edges):
        stats[part.part_id] = part_stats(part)
        if err is not None:
            continue
        path = tmp / part_name(part.part_id)
        width = index_dtype(part.num_owned + part.num_halo)
        try:
            write_part(path, part, atomic=False, deferred={"indices": ((int(part.indptr[-1]),), width)})
        except (OSError, RuntimeError, FormatError) as e:   # (h5py reports a failed flush as a RuntimeError)
            err = f"{path}: cannot be written: {failure_reason(e)}"
    agree(comm, err)
    files, cuts, err = fill_parts(comm, tmp, sl, own, rows, halos, offsets, P, None, **blocks)
    for p, cut in cuts.items():
        stats[p]["cut_edges"] = cut
    agree(comm, err)
    return files, [stats[p] for p in sorted(stats)]


def write_blocks(comm, rows: dict, offsets: np.ndarray, P: int, feature_dim: int,
                 block_edges: int = BLOCK_EDGES, block_bytes: int = FEATURE_BLOCK_BYTES) -> np.ndarray:
    """[R, K, 3]: the blocks (part, first new ID, end) in which each rank writes its parts, in order, each of
    about ``block_edges`` edges and ``block_bytes`` of features at most (one row at least); (-1, 0, 0) pads."""
    step = max(1, block_bytes // max(1, 4 * feature_dim))
    out = []
    for p in my_parts(comm, P):
        s, e = int(offsets[p]), int(offsets[p + 1])
        a, b = np.searchsorted(rows["new_ids"], (s, e))
        for x, y in row_blocks(rows["ptr"][a:b + 1] - rows["ptr"][a], block_edges):
            out += [(p, s + z, s + min(y, z + step)) for z in range(x, y, step)]
        if s == e:
            out.append((p, s, e))      # (an empty part's file is completed all the same)
    k = int(allreduce(comm, np.array([len(out)], dtype=np.int64), op=MPI.MAX)[0])
    mine = np.zeros((k, 3), dtype=np.int64)
    mine[:, 0] = -1
    if out:
        mine[:len(out)] = out
    return allgather_rows(comm, mine)


def fill_parts(comm, tmp, sl: GraphSlice, own: OwnRows, rows: dict, halos: dict, offsets: np.ndarray, P: int,
               err: str | None, **blocks) -> tuple[dict, dict, str | None]:
    """The edges (as local columns) and features of every part, written in rounds: in round j every rank sends
    each writer its rows of that writer's j-th block (:func:`write_blocks`), so that a writer holds one block at
    a time, never a whole part. Returns ({file: sha256}, {part: cut edges}, the first error); after an error this
    rank keeps taking part in the rounds without writing."""
    width = int(sl.attrs["feature_dim"])
    blocks = write_blocks(comm, rows, offsets, P, width, **blocks)
    with ExitStack() as stack:
        try:
            feats_of = stack.enter_context(SliceFeatures(sl))
        except FormatError as e:    # (the graph cannot be opened again: this rank still takes part in the rounds)
            feats_of, err = None, err or str(e)
        return _fill_rounds(comm, tmp, own, rows, halos, offsets, blocks, feats_of, width, err)


def _fill_rounds(comm, tmp, own: OwnRows, rows: dict, halos: dict, offsets: np.ndarray, blocks: np.ndarray,
                 feats_of: SliceFeatures | None, width: int, err: str | None) -> tuple[dict, dict, str | None]:
    """:func:`fill_parts`' rounds; ``feats_of`` reads this rank's rows' features for each round (None after an
    error: zeros are sent)."""
    by_id = np.argsort(own.new_ids, kind="stable")
    ptr = np.zeros(len(own.row_len) + 1, dtype=np.int64)
    np.cumsum(own.row_len, out=ptr[1:])
    mine = (by_id, own.new_ids[by_id], ptr)
    files, cuts, writer = {}, {}, None
    for j in range(blocks.shape[1]):
        ids, feats, cols, err = _block_round(comm, own, mine, blocks[:, j, 1:], feats_of, width, err)
        p, s, e = (int(x) for x in blocks[comm.rank, j])
        if p < 0:
            continue
        if len(ids) != e - s or (len(ids) and (ids[0] != s or ids[-1] != e - 1)):
            raise RuntimeError(f"part {p}: block {s}..{e} received rows {ids[:1]}..{ids[-1:]} ({len(ids)})")
        first, last = int(offsets[p]), int(offsets[p + 1])
        local, cut = _local_columns(cols, first, last, halos[p])
        cuts[p] = cuts.get(p, 0) + cut
        if err is not None:
            continue
        path = tmp / part_name(p)
        try:
            if writer is None:
                writer = PartRows(path, ("indices", "features"))
            writer.append("indices", local)
            writer.append("features", feats)
            if e == last:
                files[part_name(p)] = writer.close()
                writer = None
        except (OSError, RuntimeError, FormatError) as ex:
            err = f"{path}: cannot be written: {failure_reason(ex)}"
            if writer is not None:
                writer.close_on_error()
                writer = None
    if writer is not None:
        writer.close_on_error()
    return files, cuts, err


def _block_round(comm, own: OwnRows, mine: tuple, bounds: np.ndarray, feats_of: SliceFeatures | None, width: int,
                 err: str | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, str | None]:
    """One round: every rank sends each writer w its rows with new IDs ``bounds[w, 0] .. bounds[w, 1] - 1`` (IDs,
    features, in-edges); returns what this rank received (new IDs, features, in-edge sources), in new-ID order,
    and the first error. ``mine``: this rank's rows sorted by new ID (order, sorted IDs, CSR row pointer)."""
    by_id, ids_sorted, ptr = mine
    lo, hi = np.searchsorted(ids_sorted, bounds[:, 0]), np.searchsorted(ids_sorted, bounds[:, 1])
    send = np.concatenate([by_id[a:b] for a, b in zip(lo.tolist(), hi.tolist())])
    counts = (hi - lo).astype(np.int64)
    rc = exchange_counts(comm, counts)
    ids = alltoallv(comm, own.new_ids[send], counts, rc)
    lens = alltoallv(comm, own.row_len[send], counts, rc)
    feats = None
    if feats_of is not None and err is None:
        try:
            feats = feats_of.rows(send)
        except FormatError as e:
            err = str(e)
    dt = stored_dtype(own.feature_dtype)
    if feats is None:
        feats = np.zeros((len(send), width), dtype=dt)
    # half types as their 16-bit patterns (MPI has no float16 or bfloat16 type): copied, never converted
    feats = alltoallv(comm, feats.view(np.uint16) if dt.itemsize == 2 else feats, counts, rc).view(dt)
    edge_counts = np.array([own.row_len[by_id[a:b]].sum() for a, b in zip(lo.tolist(), hi.tolist())],
                           dtype=np.int64)
    cols = alltoallv(comm, gather_values(ptr, send, own.cols), edge_counts, exchange_counts(comm, edge_counts))
    del send
    # received by source rank, each rank's rows in new-ID order; boundary-first new IDs interleave the ranks'
    # rows, so the block is put in new-ID order here (rows, their features and their in-edges)
    if np.any(ids[1:] < ids[:-1]):
        by_new = np.argsort(ids, kind="stable")
        got_ptr = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(lens, out=got_ptr[1:])
        ids, feats, cols = ids[by_new], feats[by_new], gather_values(got_ptr, by_new, cols)
    return ids, feats, cols, err


def _local_columns(cols: np.ndarray, first: int, last: int, halo: np.ndarray) -> tuple[np.ndarray, int]:
    """(local columns, cut edges) of a part's in-edge sources ``cols`` (new IDs): its own rows ``first ..
    last - 1`` to 0 .., every other to its place after them in the part's sorted ``halo``."""
    outside = (cols < first) | (cols >= last)
    local = np.where(outside, 0, cols - first)
    local[outside] = (last - first) + np.searchsorted(halo, cols[outside])
    return local, int(outside.sum())


def write_node_map(comm, path, rows: dict, offsets: np.ndarray, P: int) -> str | None:
    """``node_map.h5`` written by rank 0 from every part's original IDs, received in part order (one part held at
    a time); returns its sha256 on rank 0 (None elsewhere). A failure on rank 0 is agreed on by every rank."""
    err, sha = None, None
    if comm.rank == 0:
        writer = None
        try:
            writer = NodeMapWriter(path, int(offsets[-1]))
        except (OSError, RuntimeError) as e:
            err = f"{path}: cannot be written: {failure_reason(e)}"
        for p in range(P):
            s, e = int(offsets[p]), int(offsets[p + 1])
            if p % comm.size == 0:
                a, b = np.searchsorted(rows["new_ids"], (s, e))
                ids = rows["orig"][a:b]
            else:
                ids = np.empty(e - s, dtype=np.int64)
                as_watchdog(comm).recv([ids, MPI.INT64_T], p % comm.size, NODE_MAP_TAG, NODE_MAP_WAIT)
            if err is None:
                try:
                    writer.append(ids)
                except (OSError, RuntimeError) as ex:
                    err = f"{path}: cannot be written: {failure_reason(ex)}"
        if err is None:
            try:
                sha = writer.close()
            except (OSError, RuntimeError) as ex:
                err = f"{path}: cannot be written: {failure_reason(ex)}"
        elif writer is not None:
            writer.close_on_error()
    else:
        for p in my_parts(comm, P):
            a, b = np.searchsorted(rows["new_ids"], (int(offsets[p]), int(offsets[p + 1])))
            as_watchdog(comm).send([np.ascontiguousarray(rows["orig"][a:b], dtype=np.int64), MPI.INT64_T], 0,
                                   NODE_MAP_TAG, NODE_MAP_WAIT)
    agree(comm, err)
    return sha


def gather_json(comm, obj) -> list | None:
    """Every rank's JSON-able ``obj`` on rank 0 (a list in rank order), None elsewhere: text, not pickles."""
    wd = as_watchdog(comm)
    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    sizes = np.zeros(comm.size, dtype=np.int64) if comm.rank == 0 else None
    wd.gather(np.array([data.size], dtype=np.int64), sizes, 0, "gather of the parts' statistics")
    if comm.rank != 0:
        wd.gatherv([data, MPI.BYTE], None, 0, "gather of the parts' statistics")
        return None
    displs = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    buf = np.empty(int(sizes.sum()), dtype=np.uint8)
    wd.gatherv([data, MPI.BYTE], [buf, (sizes, displs), MPI.BYTE], 0, "gather of the parts' statistics")
    return [json.loads(bytes(buf[d:d + n])) for d, n in zip(displs.tolist(), sizes.tolist())]


def write_partition_parallel(comm, tmp, sl: GraphSlice, lg, own_parts: np.ndarray, P: int, *, partition_id: str,
                             method: str, seed: int, extra_meta: dict, **blocks) -> dict | None:
    """Write the whole partition into the directory ``tmp`` (every rank; rank 0 writes meta.json): returns meta on
    rank 0, None elsewhere. ``lg``: the :class:`~data_tools.partitioners.stream.LocalGraph` (its ghosts). To bound
    the memory, the slice's indices, labels, masks and features and ``lg``'s edges are released (set to None) once
    used; features that ``sl`` does not hold (None) are read when the parts' blocks need them.
    ``blocks``: the sizes of the blocks in which the parts' edges and features are written (:func:`write_blocks`;
    the files do not depend on them)."""
    t0 = time.time()
    lg.indptr = lg.cols = None     # (only the ghosts and their plan are needed from here on)
    new_ids, offsets = relabel_local(comm, own_parts, P, slice_order_keys(sl, lg, own_parts, P, BLOCK_EDGES))
    own = OwnRows(comm, sl, lg, new_ids)
    sl.indices = None
    loops = int(allreduce(comm, np.array([own.loops.sum()], dtype=np.int64))[0])
    rows = shuffle(comm, sl, own, own_parts)
    own.in_deg = own.out_deg = own.loops = sl.labels = sl.masks = None     # (sent)
    halos = part_halos(comm, own, own_parts, offsets, P)
    files, stats = write_parts(comm, tmp, sl, own, rows, halos, offsets, P, partition_id, sl.num_edges - loops,
                               **blocks)
    del own, halos
    sl.features = None
    sha = write_node_map(comm, tmp / NODE_MAP_NAME, rows, offsets, P)
    got = gather_json(comm, dict(files=files, stats=stats))
    if comm.rank != 0:
        return None
    for g in got:
        files.update(g["files"])
    stats = sorted((s for g in got for s in g["stats"]), key=lambda s: s["part"])
    files[NODE_MAP_NAME] = sha
    m = sum(s["local_edges"] for s in stats)
    a = sl.attrs
    meta = dict(format=PARTITION_FORMAT, version=PARTITION_VERSION, num_parts=P, method=method, seed=seed,
                partition_id=partition_id, num_nodes=sl.num_nodes, num_edges=m, num_edges_input=sl.num_edges,
                feature_dim=int(a["feature_dim"]), feature_dtype=a.get("feature_dtype", "float32"),
                num_classes=int(a["num_classes"]), graph_source=str(a.get("source", "")), offsets=[int(o) for o in offsets], files=files,
                quality=summarize(stats, sl.num_nodes, m), parts=stats, build_seconds=round(time.time() - t0, 3))
    meta.update(extra_meta)
    write_meta(tmp, meta)
    raise_if_terminated()
    return meta

