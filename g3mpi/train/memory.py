"""The per-rank memory model of a training run (docs/MEMORY.md): bytes a rank needs, from its part's
counts and the model's widths, never from the whole graph's.

Terms (bytes): ``part`` the part file's arrays as loaded; ``matrices`` the aggregation CSR and its transpose (int32
indices where they fit, else int64: ``g3mpi.ops.blocks.csr_index_dtype``; GCN's and GAT's self loops included),
GCN's float32 weights in each, or, for SAGE's mean and GAT's pattern, one array of ones they all share (at most one
per entry); on a symmetric graph the local block (``edges - cut_edges`` entries) is its own transpose; ``exchange`` the halo and send buffers of every layer's
exchange (twice where a gradient flows back; none for a first layer that aggregates the raw input with the input
cache on: its input's halo rows are kept instead, in the stored feature dtype); ``activations`` what autograd keeps for backward in one training step
(the coefficients counted with saved-tensor hooks, ``g3mpi.bench.worker.saved_activations``, at several widths,
dropout on: its masks are kept as bool); ``params`` parameters, gradients and Adam's two moments. The peak adds the
gradients of the activations during backward, at most as large as the activations themselves, and the process's
``baseline`` (interpreter, torch, numpy, scipy, h5py, MPI). APPNP and GCNII: :func:`propagation_split`.

:func:`rank_memory_split` gives each data term split by what sizes it (:data:`CATEGORIES`: the rank's owned rows,
halo rows, send rows, local edges, or none of them), which ``g3-bench memory`` measures too (docs/BENCH.md).
:func:`pairs_split` is the ``pairs`` term of ``--task link``.
"""
from __future__ import annotations

from g3mpi.nn import specs

#: resident memory of a g3-train rank before any graph data (measured: 2 ranks on a 200-node graph, 356 MiB)
BASELINE_BYTES = 356 << 20


#: bytes per owned row and embedding column that the optimiser step of the node embedding table allocates for a
#: moment (torch's single-tensor Adam on CPU: the weight-decayed gradient, and the denominator's square root and
#: quotient): as large as the table's own bytes, three times over
EMBEDDING_STEP_BYTES = 12


def layer_widths(model: str, feature_dim: int, hidden: int, num_classes: int, layers: int = 2, heads: int = 8,
                 out_heads: int = 1) -> list[tuple[int, int, int]]:
    """(input width, output width, heads) of each layer, as the model's registry entry has them
    (``g3mpi.nn.specs.ModelSpec.layer_widths``; for the stacks as ``g3mpi.nn.GNN`` builds them)."""
    return specs.spec(model).layer_widths(feature_dim, hidden, num_classes, layers, heads, out_heads)


#: what sizes a byte of a rank's data: its owned rows, its halo rows, its send rows (one per row of a send list),
#: its local in-edges (``edges``), or none of them (``const``: parameters, a few scalars)
CATEGORIES = ("owned", "halo", "send", "edge", "const")


def split_bytes(**bytes_by_category) -> dict:
    """{category: int bytes} over every category of :data:`CATEGORIES` (0 where not given)."""
    return {c: int(bytes_by_category.get(c, 0)) for c in CATEGORIES}


def part_split(*, owned: int, halo: int, send: int, edges: int, feature_dim: int) -> dict:
    """:func:`part_bytes` by what sizes it: per owned row 51 + 4F (features, labels, masks, IDs, self loops, the row
    pointer, the two degrees), per halo row 24 (its global ID and degrees), per send row 8, per edge 4, and 8."""
    return split_bytes(owned=owned * (51 + 4 * feature_dim), halo=24 * halo, send=8 * send, edge=4 * edges, const=8)


def part_bytes(*, owned: int, halo: int, send: int, edges: int, feature_dim: int) -> int:
    """Bytes of one part file's arrays as loaded (``owned``, ``halo``, ``send`` rows and ``edges`` local in-edges,
    as in meta.json's ``parts``)."""
    return sum(part_split(owned=owned, halo=halo, send=send, edges=edges, feature_dim=feature_dim).values())


def largest_part_bytes(meta: dict) -> int:
    """:func:`part_bytes` of the largest part of a partition (meta.json), 0 where meta.json does not say."""
    try:
        return max(part_bytes(owned=int(p["owned"]), halo=int(p["halo"]), send=int(p["send"]),
                              edges=int(p["local_edges"]), feature_dim=int(meta["feature_dim"]))
                   for p in meta["parts"])
    except (KeyError, TypeError, ValueError):
        return 0


def matrices_split(*, owned: int, halo: int, edges: int, cut_edges: int = 0, symmetric: bool = False,
                   self_loops: bool = True, weighted: bool = True) -> dict:
    """The ``matrices`` term of one aggregation matrix (``g3mpi.ops.blocks.BlockMatrix``) by what sizes it.

    Entries: nnz = e (+ n self loops), stored in the blocks and again in their transposes, but the local block
    (nnz - c entries, c = ``cut_edges``) once on a ``symmetric`` graph: stored = 2 nnz - (nnz - c). The n self-loop
    entries (one or two copies) are per owned row, the rest per edge. Index bytes w (4, or 8 past 2^31) per stored
    entry and per row pointer (2n + h: the local block, its transpose and the neighbour blocks' transposes);
    values: float32 per stored entry where ``weighted`` (GCN), else one shared array of ones per entry (an upper
    bound: it is as long as the largest block)."""
    n, h, e = owned, halo, edges
    loops = n if self_loops else 0
    nnz = e + loops
    w = 4 if max(nnz, n + h) < 2 ** 31 else 8      # index bytes (csr_index_dtype)
    stored = 2 * nnz - (nnz - cut_edges if symmetric else 0)    # entries of the blocks and of their own transposes
    loops_stored = loops if symmetric else 2 * loops
    per_entry = w + (4 if weighted else 0)
    return split_bytes(owned=per_entry * loops_stored + (0 if weighted else 4 * loops) + w * 2 * n, halo=w * h,
                  edge=per_entry * (stored - loops_stored) + (0 if weighted else 4 * e))


def head_pattern_split(*, owned: int, halo: int, edges: int, heads: int) -> dict:
    """GAT's head-expanded patterns for ``heads`` heads (``g3mpi.ops.heads.HeadPattern``, one per block, shared by
    the layers with that head count) by what sizes them: per entry and head the expanded column and value
    permutation, in the pattern and in its transpose (the forward permutation is absent for one head), over the
    e edges and n self loops (per owned row); per head a row pointer per owned row in the local pattern and its
    transpose, and per halo row in the neighbour blocks' transposes. (The neighbour patterns' own row pointers,
    one per receiving row and head, are not counted: their rows are not among the counts.)"""
    n, h, e, k = owned, halo, edges, heads
    w = 4 if max(n + h, e + n) * k < 2 ** 31 else 8
    per_entry = w * k * (4 if k > 1 else 3)
    return split_bytes(owned=per_entry * n + 2 * w * k * n, halo=w * k * h, edge=per_entry * e)


def exchange_split(*, halo: int, send: int, exchanged: int, kept_halo_width: int = 0, feature_bytes: int = 4) -> dict:
    """The ``exchange`` term by what sizes it: ``exchanged`` = sum over exchanges of width x directions (m_l w_l:
    2 where a gradient flows back) float32 values per halo row and per send row, and a kept input halo of
    ``kept_halo_width`` features of ``feature_bytes`` per halo row."""
    return split_bytes(halo=4 * halo * exchanged + feature_bytes * halo * kept_halo_width, send=4 * send * exchanged)


def typed_matrices_split(*, owned: int, halo: int, edges: int, relations: int) -> dict:
    """The ``matrices`` term of R-GCN's typed block (``BlockMatrix.fold`` = R): one entry per edge (no self
    loops), its column j R + r and its 1 / c_{i,r} in the blocks and again in their transposes; row pointers of
    the local block (n) and of the transposes, which have R rows per source (R n + R h)."""
    n, h, e, R = owned, halo, edges, relations
    w = 4 if max(e, R * (n + h)) < 2 ** 31 else 8
    return split_bytes(owned=w * n * (1 + R), halo=w * R * h, edge=2 * (w + 4) * e)


def propagation_split(form: str, *, owned: int, halo: int, send: int, edges: int, feature_dim: int, hidden: int,
                      num_classes: int, layers: int, k: int, cut_edges: int = 0, symmetric: bool = False,
                      node_embedding: int = 0) -> dict:
    """:func:`rank_memory_split` of APPNP (``form`` "appnp": an MLP of ``layers`` linears, then ``k`` steps) and
    GCNII ("gcn2": ``layers`` layers between an input and an output linear), whatever ``--remat`` says (they keep
    what autograd saves). Matrices: GCN's, one set for every step. Exchanges: each step's or layer's, C (APPNP) or
    ``hidden`` (GCNII) wide, both ways (what travels comes from parameters). Activations, floats per owned row:
    the first linear's dropped input, F (its mask is not kept: the input has no gradient); 2.25 per column of a
    ReLU output, its bool dropout mask and the dropped rows a product reads: APPNP's MLP's a_l for l >= 1; GCNII's
    per layer (its input's ReLU, the mask, the identity mapping's s) and for the output linear, 2.25 hidden
    (L + 1); the loss 3C, as the stacks. A step keeps nothing: its scalings and sums save no tensor, its
    aggregation's backward is the transposed product. Parameters: the linears' weights and biases, GCNII's
    [hidden, hidden] weight a layer. A node embedding of D columns widens the first linear's input to F + D and
    counts as for the stacks (:func:`rank_memory_split`); nothing of it travels."""
    n, F, H, C, D = owned, feature_dim, hidden, num_classes, node_embedding
    widths = specs.MODELS[form].layer_widths(F + D, H, C, layers)
    if form == "appnp":
        exchanged, rows = 2 * k * C, F + D + 2.25 * sum(a for a, _, _ in widths[1:])
        params = sum(a * b + b for a, b, _ in widths)
    else:
        exchanged, rows = 2 * layers * H, F + D + 2.25 * H * (layers + 1)
        params = (F + D) * H + H + H * C + C + layers * H * H
    return dict(part=part_split(owned=n, halo=halo, send=send, edges=edges, feature_dim=F),
                matrices=matrices_split(owned=n, halo=halo, edges=edges, cut_edges=cut_edges, symmetric=symmetric),
                exchange=exchange_split(halo=halo, send=send, exchanged=exchanged),
                activations=split_bytes(owned=4 * n * (rows + 3 * C)),
                params=split_bytes(const=16 * params, owned=(16 + EMBEDDING_STEP_BYTES) * n * D))


def rank_memory_split(model: str, *, owned: int, halo: int, send: int, edges: int, feature_dim: int, hidden: int,
                      num_classes: int, layers: int = 2, heads: int = 8, out_heads: int = 1, feature_bytes: int = 4,
                      input_cache: bool = True, remat: bool = False, cut_edges: int = 0,
                      symmetric: bool = False, relations: int = 0, num_bases: int = 0, num_blocks: int = 0,
                      node_embedding: int = 0, k: int = specs.SETTINGS["k"].default) -> dict:
    """:func:`rank_memory`'s data terms (part, matrices, exchange, activations, params), each split by what sizes it:
    {term: {category: bytes}} over :data:`CATEGORIES` (the arguments are rank_memory's). Bytes per owned row,
    halo row, send row or edge of a term are its category's bytes over that count (:func:`per_unit`). Self-loop
    entries of the matrices and of GAT's per-edge attention terms are per owned row; activations are all per owned
    row but GAT's per-edge terms; parameters (with gradients and Adam's moments) are ``const``, but the node
    embedding table's (``node_embedding`` D: 16 D bytes per owned row: the rows, their gradients, Adam's two
    moments; and :data:`EMBEDDING_STEP_BYTES` D for the optimiser step's temporaries), which is per owned row;
    its halo rows travel in the first layer's exchange, both ways."""
    n, h, s, e, F, C, D, R = owned, halo, send, edges, feature_dim, num_classes, node_embedding, relations
    sp = specs.spec(model)
    if not sp.aggregation:
        raise ValueError(f"the memory model models the plain stacks of one aggregation, not model {model!r}")
    if sp.form != "stack":
        return propagation_split(sp.form, owned=n, halo=h, send=s, edges=e, feature_dim=F, hidden=hidden,
                                 num_classes=C, layers=layers, k=k, cut_edges=cut_edges, symmetric=symmetric,
                                 node_embedding=D)
    att, root = sp.aggregation == "gat", sp.root_weight      # attention (GAT); a root weight (SAGE, R-GCN)
    typed = sp.aggregation == "typed"
    if typed and R < 1:
        raise ValueError(f"the memory model of {model!r} needs the graph's relations (relations=R)")
    widths = layer_widths(model, F + D, hidden, C, layers, heads, out_heads)
    input_cache = input_cache and not D     # (a trained input: nothing constant to keep)
    part = part_split(owned=n, halo=h, send=s, edges=e, feature_dim=F)
    # (SAGE's mean and GAT's pattern share one array of ones; SAGE adds no self loops)
    matrices = typed_matrices_split(owned=n, halo=h, edges=e, relations=R) if typed else \
        matrices_split(owned=n, halo=h, edges=e, cut_edges=cut_edges, symmetric=symmetric,
                       self_loops=sp.aggregation != "mean", weighted=sp.aggregation == "gcn")
    if sp.aggregation == "mean":     # the mean's row scaling, 1 / in-degree
        matrices["owned"] += 4 * n
    if att:
        for k in sorted({k for _, _, k in widths}):
            pattern = head_pattern_split(owned=n, halo=h, edges=e, heads=k)
            matrices = {c: matrices[c] + pattern[c] for c in CATEGORIES}
    exchanged = 0
    for i, (a, b, k) in enumerate(widths):
        if att:   # transformed features and the source attention term, one message
            exchanged += 2 * (b * (k if i == len(widths) - 1 else 1) + k)
        elif typed:     # every row's R messages x_j Theta_r, both ways
            exchanged += 2 * R * b
        elif i == 0 and a <= b and input_cache:     # the input's halo rows kept, nothing exchanged
            continue
        else:   # the narrower side travels; the raw input of an aggregate-first first layer has no gradient
            exchanged += min(a, b) * (1 if i == 0 and a <= b and not D else 2)
    kept = F if not att and not typed and widths[0][0] <= widths[0][1] and input_cache else 0
    exchange = exchange_split(halo=h, send=s, exchanged=exchanged, kept_halo_width=kept, feature_bytes=feature_bytes)
    hidden_in = sum(a for a, _, _ in widths[1:])
    per_edge = saved_halo = 0
    if att and remat:    # no per-edge term: the inputs, transformed rows, ELU, 4 [n, heads] terms a layer
        rows = 4 * n * (1.25 * widths[0][0] + 3.25 * hidden_in + (widths[-1][2] + 3) * C
                        + 4 * sum(k for _, _, k in widths))
    elif att:    # per entry of the blocks: e edges and n self loops; each layer's received halo x'
        per_edge = 16 * sum(k for _, _, k in widths) + 16
        rows = 4 * n * (widths[0][0] + 3.75 * hidden_in + 4 * C) + n * per_edge
        saved_halo = 4 * h * sum(b * (k if i == len(widths) - 1 else 1) for i, (_, b, k) in enumerate(widths))
    elif remat:   # each layer's aggregate (the narrower side) and SAGE's own term, below the last layer; the loss
        rows = 4 * n * (sum(min(a, b) + (b if root else 0) for a, b, _ in widths[:-1]) + 3 * C)
    else:
        rows = 4 * n * (widths[0][0] + 2.25 * hidden_in + 3 * C)
    if typed:   # each layer's input x kept for its weight products; the widest messages [n, R out] (and in
        # backward their gradient, as wide: the peak's second count of the activations)
        rows = 4 * n * (widths[0][0] + sum(a + b for a, b, _ in widths[1:]) + 3 * C
                        + R * max(b for _, b, _ in widths))
    activations = split_bytes(owned=rows, halo=saved_halo, edge=e * per_edge)     # (each a whole number of bytes)
    params = 0
    for i, (a, b, k) in enumerate(widths):
        if att:   # weight, source and target attention, bias; the last layer's heads are averaged
            lin = k * b if i == len(widths) - 1 else b
            params += a * lin + 2 * lin + b
        elif typed:     # the relations' weights (basis: B bases and R x B coefficients; block: R K blocks), root, bias
            rel = num_bases * (a * b + R) if num_bases else R * a * b // max(1, num_blocks)
            params += rel + a * b + b
        else:   # SAGE: a root weight beside the neighbours' one
            params += (2 if root else 1) * a * b + b
    return dict(part=part, matrices=matrices, exchange=exchange, activations=activations,
                params=split_bytes(const=16 * params, owned=(16 + EMBEDDING_STEP_BYTES) * n * D))


def by_category(split: dict) -> dict:
    """{category: bytes} summed over the terms of a split (:func:`rank_memory_split`)."""
    return {c: sum(t[c] for t in split.values()) for c in CATEGORIES}


#: the count each category's bytes are divided by in :func:`per_unit`: (unit name, count's name)
UNITS = (("owned_row", "owned"), ("halo_row", "halo"), ("send_row", "send"), ("edge", "edges"))


def per_unit(cats: dict, *, owned: int, halo: int, send: int, edges: int) -> dict:
    """Bytes per owned row, halo row, send row and local edge of a {category: bytes} (``owned`` / n, ``halo`` / h,
    ``send`` / s, ``edge`` / e; None where the count is 0)."""
    counts = dict(owned=owned, halo=halo, send=send, edges=edges)
    cat = dict(owned="owned", halo="halo", send="send", edges="edge")
    return {u: (cats[cat[k]] / counts[k] if counts[k] else None) for u, k in UNITS}


def rank_memory(model: str, *, owned: int, halo: int, send: int, edges: int, feature_dim: int, hidden: int,
                num_classes: int, layers: int = 2, heads: int = 8, out_heads: int = 1, feature_bytes: int = 4,
                input_cache: bool = True, remat: bool = False, cut_edges: int = 0, symmetric: bool = False,
                relations: int = 0, num_bases: int = 0, num_blocks: int = 0, node_embedding: int = 0,
                k: int = specs.SETTINGS["k"].default) -> dict:
    """Bytes of each term for one rank (``owned``, ``halo``, ``send`` rows, ``edges`` in-edges and ``cut_edges``
    of them from halo rows, as in meta.json's ``parts``; ``feature_bytes`` per stored feature, 2 for float16 and
    bfloat16), with ``peak`` = baseline + data + activations twice + params. ``remat``: ``--remat cheap``.
    ``symmetric``: the graph is (the local block shares its transpose). ``relations`` R (R-GCN; with
    ``num_bases`` / ``num_blocks``), ``node_embedding`` D (``--node-embedding``: the model's input is D + F wide). ``k``: APPNP's steps.
    Each term is the sum of its :func:`rank_memory_split`."""
    split = rank_memory_split(model, owned=owned, halo=halo, send=send, edges=edges, feature_dim=feature_dim,
                              hidden=hidden, num_classes=num_classes, layers=layers, heads=heads,
                              out_heads=out_heads, feature_bytes=feature_bytes, input_cache=input_cache, remat=remat,
                              cut_edges=cut_edges, symmetric=symmetric, relations=relations, num_bases=num_bases,
                              num_blocks=num_blocks, node_embedding=node_embedding, k=k)
    terms = {t: sum(v.values()) for t, v in split.items()}
    terms["peak"] = BASELINE_BYTES + sum(terms.values()) + terms["activations"]
    return terms


def pairs_split(*, pairs: int, fetched: int, sent: int, width: int, owned: int = 0, nodes: int = 0,
                fused: bool = True, chunk: int = 1 << 18) -> dict:
    """Bytes of one rank's training pairs of ``--task link`` (``g3mpi.ops.pairs``), by what sizes them. Per pair: 16
    for the pairs' global IDs as planned, 16 for the plan (source and destination rows, int64), 24 for the loss (the
    logit, its label, BCE's saved terms, the logit's gradient and its copy in transposed order); ``fused`` (a dot
    decoder) 16 for the pattern (its columns, the transpose's rows and order, its zero values: int32), else 32
    for the per-row path's group order and row lists; per fetched and per sent row ``width`` float32 twice (the rows
    and their gradients); ``fused``: the table of owned and fetched rows (its copy of the owned rows, and its
    gradient: 8 ``width`` per owned row), ``nodes`` x 8 for a node-ID map kept whole (``IdDirectory``'s
    ``replicate``: sampled negatives); else the gathered rows of one scored chunk (2 x min(pairs, ``chunk``) x
    ``width`` float32). Pairs count as ``owned``, fetched rows as ``halo``, sent rows as ``send``."""
    per_pair = 56 + (16 if fused else 32)
    table = 8 * width * owned if fused else 0
    return split_bytes(owned=per_pair * pairs + table, halo=8 * width * fetched, send=8 * width * sent,
                       const=8 * nodes if fused else 8 * width * min(pairs, chunk))
