"""The per-rank memory model of a training run (docs/MEMORY.md): bytes a rank needs, from its part's
counts and the model's widths, never from the whole graph's.

Terms (bytes): ``part`` the part file's arrays as loaded; ``matrices`` the aggregation CSR and its transpose (int32
indices where they fit, else int64: ``g3mpi.ops.blocks.csr_index_dtype``; GCN's and GAT's self loops included),
GCN's float32 weights in each, or, for SAGE's mean and GAT's pattern, one array of ones they all share (at most one
per entry); on a symmetric graph the local block (``edges - cut_edges`` entries) is its own transpose; ``exchange`` the halo and send buffers of every layer's
exchange (twice where a gradient flows back; none for a first layer that aggregates the raw input with the input
cache on: its input's halo rows are kept instead, in the stored feature dtype); ``activations`` what autograd keeps for backward in one training step
(the coefficients counted with saved-tensor hooks, ``g3mpi.bench.worker.saved_activation_bytes``, at several widths,
dropout on: its masks are kept as bool); ``params`` parameters, gradients and Adam's two moments. The peak adds the
gradients of the activations during backward, at most as large as the activations themselves, and the process's
``baseline`` (interpreter, torch, numpy, scipy, h5py, MPI).
"""
from __future__ import annotations

#: resident memory of a g3-train rank before any graph data (measured: 2 ranks on a 200-node graph, 356 MiB)
BASELINE_BYTES = 356 << 20


def layer_widths(model: str, feature_dim: int, hidden: int, num_classes: int, layers: int = 2, heads: int = 8,
                 out_heads: int = 1) -> list[tuple[int, int, int]]:
    """(input width, output width, heads) of each layer, as ``g3mpi.nn.GNN`` builds them."""
    out, d = [], feature_dim
    for i in range(layers):
        last = i == layers - 1
        ch = num_classes if last else hidden
        h = (out_heads if last else heads) if model == "gat" else 1
        out.append((d, ch * h if model == "gat" and not last else ch, h))
        d = out[-1][1]
    return out


def part_bytes(*, owned: int, halo: int, send: int, edges: int, feature_dim: int) -> int:
    """Bytes of one part file's arrays as loaded (``owned``, ``halo``, ``send`` rows and ``edges`` local in-edges,
    as in meta.json's ``parts``)."""
    return owned * (51 + 4 * feature_dim) + 24 * halo + 8 * send + 4 * edges + 8


def largest_part_bytes(meta: dict) -> int:
    """:func:`part_bytes` of the largest part of a partition (meta.json), 0 where meta.json does not say."""
    try:
        return max(part_bytes(owned=int(p["owned"]), halo=int(p["halo"]), send=int(p["send"]),
                              edges=int(p["local_edges"]), feature_dim=int(meta["feature_dim"]))
                   for p in meta["parts"])
    except (KeyError, TypeError, ValueError):
        return 0


def rank_memory(model: str, *, owned: int, halo: int, send: int, edges: int, feature_dim: int, hidden: int,
                num_classes: int, layers: int = 2, heads: int = 8, out_heads: int = 1, feature_bytes: int = 4,
                input_cache: bool = True, remat: bool = False, cut_edges: int = 0, symmetric: bool = False) -> dict:
    """Bytes of each term for one rank (``owned``, ``halo``, ``send`` rows, ``edges`` in-edges and ``cut_edges``
    of them from halo rows, as in meta.json's ``parts``; ``feature_bytes`` per stored feature, 2 for float16 and
    bfloat16), with ``peak`` = baseline + data + activations twice + params. ``remat``: ``--remat cheap``.
    ``symmetric``: the graph is (the local block shares its transpose)."""
    n, h, s, e, F, C = owned, halo, send, edges, feature_dim, num_classes
    widths = layer_widths(model, F, hidden, C, layers, heads, out_heads)
    part = part_bytes(owned=n, halo=h, send=s, edges=e, feature_dim=F)
    nnz = e if model == "sage" else e + n
    w = 4 if max(nnz, n + h) < 2 ** 31 else 8      # index bytes (csr_index_dtype)
    stored = 2 * nnz - (nnz - cut_edges if symmetric else 0)    # entries of the blocks and of their own transposes
    values = 4 * stored if model == "gcn" else 4 * nnz          # (shared ones: an upper bound, the largest block's)
    matrices = w * stored + values + w * (2 * n + h)
    exchanged = 0
    for i, (a, b, k) in enumerate(widths):
        if model == "gat":   # transformed features and the source attention term, one message
            exchanged += 2 * (b * (k if i == len(widths) - 1 else 1) + k)
        elif i == 0 and a <= b and input_cache:     # the input's halo rows kept, nothing exchanged
            continue
        else:   # the narrower side travels; the raw input of an aggregate-first first layer has no gradient
            exchanged += min(a, b) * (1 if i == 0 and a <= b else 2)
    exchange = 4 * (h + s) * exchanged
    if model != "gat" and widths[0][0] <= widths[0][1] and input_cache:
        exchange += feature_bytes * h * F
    hidden_in = sum(a for a, _, _ in widths[1:])
    if model == "gat" and remat:    # no per-edge term: the inputs, transformed rows, ELU, 4 [n, heads] terms a layer
        activations = 4 * n * (1.25 * F + 3.25 * hidden_in + (widths[-1][2] + 3) * C + 4 * sum(k for _, _, k in widths))
    elif model == "gat":
        activations = 4 * n * (F + 3.75 * hidden_in + 4 * C) + (e + n) * (16 * sum(k for _, _, k in widths) + 16)
    elif remat:   # each layer's aggregate (the narrower side) and SAGE's own term, below the last layer; the loss
        activations = 4 * n * (sum(min(a, b) + (b if model == "sage" else 0) for a, b, _ in widths[:-1]) + 3 * C)
    else:
        activations = 4 * n * (F + 2.25 * hidden_in + 3 * C)
    params = 0
    for i, (a, b, k) in enumerate(widths):
        if model == "gat":   # weight, source and target attention, bias; the last layer's heads are averaged
            lin = k * b if i == len(widths) - 1 else b
            params += a * lin + 2 * lin + b
        else:   # SAGE: a root weight beside the neighbours' one
            params += (2 if model == "sage" else 1) * a * b + b
    terms = dict(part=part, matrices=matrices, exchange=exchange, activations=int(activations), params=16 * params)
    terms["peak"] = BASELINE_BYTES + sum(terms.values()) + terms["activations"]
    return terms
