"""``g3-inspect``: validate a graph.h5 or a partition directory and print its summary (or JSON, or a plot).

    g3-inspect graph.h5
    g3-inspect parts/ --json
    g3-inspect parts/ --plot parts.png

For a graph: checksums, shapes, dtypes, CSR bounds, labels and masks (``g3mpi.format.load_graph``), finite
features.
For a partition: meta.json, node_map.h5 and every part file (checksums, shapes, dtypes, indices, via
``g3mpi.format.read_part``), then what no single part can show: the node map is a permutation and each
node is owned exactly once, for EVERY pair of parts (p, q) the halo slice of q inside p is exactly
``owned_start(q) + send rows of q for p`` (and a part sends to p iff p receives from it), halo degrees agree
with their owners, global out-degrees agree with the edges stored across all parts, and meta.json's totals
agree with the parts. Any inconsistency: one line ``g3-inspect: error: <path>: <what>``, exit status 1.
"""
from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path

import numpy as np

from g3mpi.format import (FormatError, atomic_file, graph_summary, load_graph, open_graph, part_name,
                          read_meta, read_node_map, read_part)
from g3mpi.format.graph import check_features
from g3mpi.format.schema import is_int
from g3mpi.format.partition import META_NAME, NODE_MAP_NAME
from g3mpi.plotting import figure, index_axis, legend_above, mean_max, stacked

from .build import summarize
from .partitioners.cost import CostModel

PROG = "g3-inspect"


def cost_model_of(meta: dict, meta_path: Path) -> CostModel:
    """The cost model g3-partition recorded in meta.json (``cost_model``), else the default at the features'
    width (a partition written without one). A recorded one that is malformed is refused, naming meta.json:
    reporting estimates under other coefficients than the recorded ones would mislead."""
    cm = meta.get("cost_model")
    if cm is None:
        return CostModel(width=max(1, int(meta.get("feature_dim", 1))))
    names = {f.name: f.type for f in dataclasses.fields(CostModel)}
    if not isinstance(cm, dict) or set(cm) - set(names):
        what = sorted(set(cm) - set(names)) if isinstance(cm, dict) else type(cm).__name__
        raise FormatError(meta_path, f"cost_model: unexpected {what} (expected a table of {sorted(names)})")
    for k, v in cm.items():
        whole = names[k] == "int"
        ok = is_int(v) if whole else isinstance(v, (int, float)) and not isinstance(v, bool)
        if not ok or not (0 < v < float("inf")):
            raise FormatError(meta_path, f"cost_model: {k} is {v!r}, expected a positive "
                                         f"{'integer' if whole else 'finite number'}")
    return CostModel(**cm)


def inspect_graph(path: Path) -> dict:
    g = load_graph(path, features=False)   # checked by their checksum; the report needs only the structure
    with open_graph(path) as f:   # and finite, which no checksum shows (g3-partition refuses such a graph)
        check_features(path, f["features"], g.orig_ids, g.feature_dtype)
    s = graph_summary(g)
    deg = np.diff(g.indptr)
    s.update(kind="graph", path=str(path), max_in_degree=int(deg.max()) if len(deg) else 0,
             self_loop_edges=int((g.indices == np.repeat(np.arange(g.num_nodes), deg)).sum()))
    if g.edge_type is not None:
        s["relations"] = relation_counts(g.edge_type, g.num_relations, g.relation_names)
    return s


def relation_counts(edge_type: np.ndarray, num_relations: int, names: list | None) -> dict:
    """{relation name (or ID): number of edges of it}."""
    counts = np.bincount(edge_type, minlength=num_relations)
    return {(names[r] if names else str(r)): int(c) for r, c in enumerate(counts)}


def part_link_counts(parts: list, meta: dict, path: Path) -> dict:
    """The pairs and shared negatives of each split summed over the parts (FormatError unless meta.json's)."""
    from g3mpi.format.links import link_name
    out = {}
    for split, want in (meta.get("links") or {}).items():
        got = {k: sum(len(p.links.get(link_name(split, k), ())) for p in parts) for k in ("edge", "edge_neg")
               if k in want}
        for k, v in got.items():
            if v != want[k]:
                raise FormatError(path / META_NAME, f"links: {split} has {want[k]} {k} pairs, the parts hold {v}")
        out[split] = dict(want)
    return out


def inspect_partition(path: Path) -> dict:
    """Validate a whole partition directory; returns the report (FormatError on any inconsistency)."""
    meta = read_meta(path)
    P, N = int(meta["num_parts"]), int(meta["num_nodes"])
    meta_path = path / META_NAME
    _check_file_list(path, meta, P)
    new_to_orig = read_node_map(path, meta)
    if not np.array_equal(np.sort(new_to_orig), np.arange(N)):
        raise FormatError(path / NODE_MAP_NAME, "new_to_orig is not a permutation of 0..N-1")
    model = cost_model_of(meta, meta_path)
    parts, in_deg_global, out_deg_seen = _read_parts(path, meta, new_to_orig)
    stats = []
    for p, part in enumerate(parts):
        _check_against_the_others(path, p, parts, in_deg_global, out_deg_seen)
        stats.append(_part_stats(p, part, model))
    num_edges = sum(s["local_edges"] for s in stats)
    if int(meta.get("num_edges", num_edges)) != num_edges:
        raise FormatError(meta_path, f"num_edges {meta['num_edges']} != {num_edges} edges stored in the parts")
    report = dict(kind="partition", path=str(path), method=meta.get("method"), seed=meta.get("seed"),
                  feature_dim=meta.get("feature_dim"), num_classes=meta.get("num_classes"),
                  train=sum(s["train"] for s in stats), val=sum(s["val"] for s in stats),
                  test=sum(s["test"] for s in stats))
    report.update(summarize(stats, N, num_edges))
    if meta.get("links"):
        report["links"] = part_link_counts(parts, meta, path)
    if meta.get("num_relations"):
        R = int(meta["num_relations"])
        report["relations"] = relation_counts(np.concatenate([p.edge_type for p in parts]), R,
                                              meta.get("relation_names"))
    cost = np.array([s["est_epoch_seconds"] for s in stats])
    report.update(est_max_epoch_seconds=float(cost.max()), est_mean_epoch_seconds=float(cost.mean()),
                  total_bytes_per_layer=int(sum(s["bytes_per_layer"] for s in stats)) // 2,
                  cost_model=model.to_dict(), parts=stats)
    for k in ("balance", "objective_before", "objective_after", "iterations", "partition_seconds"):
        if k in meta:
            report[k] = meta[k]
    return report


def _check_file_list(path: Path, meta: dict, P: int) -> None:
    """meta.json's files are the node map and the P part files, and the directory holds no other part file."""
    want_files = {part_name(p) for p in range(P)} | {NODE_MAP_NAME}
    if set(meta["files"]) != want_files:
        raise FormatError(path / META_NAME, f"files lists {sorted(set(meta['files']) ^ want_files)} wrongly")
    extra = sorted(f.name for f in path.glob("part-*.h5") if f.name not in want_files)
    if extra:
        raise FormatError(path / extra[0], f"stray part file (the partition has {P} parts)")


def _read_parts(path: Path, meta: dict, new_to_orig: np.ndarray) -> tuple[list, np.ndarray, np.ndarray]:
    """Every part (structure only, its own checks passed, its IDs those of the node map), the global in-degree
    of each node as its owner stores it, and the out-degree of each node over the edges of all parts."""
    N = int(meta["num_nodes"])
    offsets = np.asarray(meta["offsets"], dtype=np.int64)
    parts = []
    out_deg_seen = np.zeros(N, dtype=np.int64)
    in_deg_global = np.zeros(N, dtype=np.int64)
    for p in range(int(meta["num_parts"])):
        part = read_part(path, p, meta)
        f = path / part_name(p)
        if not np.array_equal(part.orig_ids, new_to_orig[offsets[p]:offsets[p + 1]]):
            raise FormatError(f, "orig_ids disagree with node_map.h5")
        part.features = None  # only the structure is needed from here on
        gcols = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])[part.indices]
        out_deg_seen += np.bincount(gcols, minlength=N)
        in_deg_global[part.owned_start:part.owned_end] = part.in_degree[:part.num_owned]
        parts.append(part)
    return parts, in_deg_global, out_deg_seen


def _check_against_the_others(path: Path, p: int, parts: list, in_deg_global: np.ndarray,
                              out_deg_seen: np.ndarray) -> None:
    """Part p's degrees agree with the owners' and with all edges, and each of its halo slices with the sender's
    send list (a part receives from q exactly when q sends to it)."""
    part = parts[p]
    f = path / part_name(p)
    rows = np.concatenate([np.arange(part.owned_start, part.owned_end), part.halo_ids])
    if not np.array_equal(part.in_degree, in_deg_global[rows]):
        raise FormatError(f, "in_degree of halo rows disagrees with their owners")
    if not np.array_equal(part.out_degree, out_deg_seen[rows]):
        raise FormatError(f, "out_degree disagrees with the edges stored across all parts")
    recv = {int(q): i for i, q in enumerate(part.recv_parts)}
    for q, other in enumerate(parts):
        if q == p:
            continue
        sends = {int(r): i for i, r in enumerate(other.send_parts)}
        fq = path / part_name(q)
        if (q in recv) != (p in sends):
            raise FormatError(f if q in recv else fq,
                              f"part {p} {'receives' if q in recv else 'does not receive'} from part {q} but part "
                              f"{q} {'sends' if p in sends else 'does not send'} to it")
        if q in recv:
            i, j = recv[q], sends[p]
            halo = part.halo_ids[part.recv_offsets[i]:part.recv_offsets[i + 1]]
            want = other.owned_start + other.send_list(j)
            if not np.array_equal(halo, want):
                raise FormatError(f, f"halo slice from part {q} disagrees with {fq.name}'s send list for part {p}")


def _part_stats(p: int, part, model) -> dict:
    """Part p's row of the report: sizes, communication and the cost model's estimates."""
    st = dict(part=p, owned=part.num_owned, local_edges=int(part.indptr[-1]), halo=part.num_halo,
              send=int(len(part.send_rows)), recv=part.num_halo,
              neighbors=int(len(np.union1d(part.recv_parts, part.send_parts))),
              cut_edges=int((part.indices >= part.num_owned).sum()), train=int(part.train_mask.sum()),
              val=int(part.val_mask.sum()), test=int(part.test_mask.sum()))
    comm = st["halo"] + st["send"]
    c, m = model.layer_costs([st["local_edges"]], [comm])
    st.update(bytes_per_layer=int(model.layer_bytes([comm])[0]), est_compute_seconds=float(c[0]),
              est_comm_seconds=float(m[0]), est_epoch_seconds=float(model.epoch_costs([st["local_edges"]],
                                                                                      [comm])[0]))
    return st


def inspect_path(path) -> dict:
    path = Path(path)
    if path.is_dir():
        return inspect_partition(path)
    if not path.exists():
        raise FormatError(path, "no such file or directory")
    return inspect_graph(path)


def fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024:
            return f"{b:.0f}{unit}" if unit == "B" else f"{b:.1f}{unit}"
        b /= 1024
    return f"{b:.1f}TiB"


def print_report(r: dict, out=sys.stdout) -> None:
    if r["kind"] == "graph":
        print(f"graph {r['path']}: OK", file=out)
        for k in ("num_nodes", "num_edges", "feature_dim", "num_classes", "symmetric", "self_loops", "source",
                  "labelled", "train", "val", "test", "max_in_degree", "self_loop_edges"):
            print(f"  {k:<16} {r[k]}", file=out)
        _print_links(r, out)
        return
    print(f"partition {r['path']}: OK ({r['num_parts']} parts, method {r['method']}, seed {r['seed']})", file=out)
    print(f"  nodes {r['num_nodes']}  edges {r['num_edges']}  features {r['feature_dim']}  classes {r['num_classes']}"
          f"  train/val/test {r['train']}/{r['val']}/{r['test']}", file=out)
    cols = ("part", "owned", "local_edges", "halo", "send", "recv", "neighbors", "train", "bytes/layer", "est_epoch_ms")
    print("  " + " ".join(f"{c:>12}" for c in cols), file=out)
    for s in r["parts"]:
        vals = (s["part"], s["owned"], s["local_edges"], s["halo"], s["send"], s["recv"], s["neighbors"], s["train"],
                fmt_bytes(s["bytes_per_layer"]), f"{1e3 * s['est_epoch_seconds']:.3f}")
        print("  " + " ".join(f"{v:>12}" for v in vals), file=out)
    print(f"  edge_cut {r['edge_cut']}  replication_factor {r['replication_factor']:.3f}  "
          f"node_imbalance {r['node_imbalance']:.3f}  compute_imbalance {r['compute_imbalance']:.3f}  "
          f"comm_imbalance {r['comm_imbalance']:.3f}  max_comm_rows {r['max_comm_rows']}  "
          f"est_max_epoch_ms {1e3 * r['est_max_epoch_seconds']:.3f}", file=out)
    _print_links(r, out)


def _print_links(r: dict, out) -> None:
    """The link splits (pairs, shared negatives, negatives per positive) and the edges of each relation."""
    links = r.get("links") or {}
    for split, c in sorted(links.items(), key=lambda kv: ("train", "val", "test").index(kv[0])):
        extra = "".join(f"  {k} {v}" for k, v in c.items() if k != "edge")
        print(f"  link {split:<11} {c.get('edge', 0)} pairs{extra}", file=out)
    rel = r.get("relations")
    if rel:
        shown = ", ".join(f"{k} {v}" for k, v in list(rel.items())[:20])
        more = f", ... ({len(rel) - 20} more)" if len(rel) > 20 else ""
        print(f"  relations        {len(rel)}: {shown}{more}", file=out)


#: the plot's widest figure (inches, at 100 dpi): 40 parts at 0.35 inch each; more parts get thinner bars
PLOT_MAX_INCHES = 16


def check_plot_path(path: Path) -> str:
    """The image format of ``path`` (its suffix); FormatError unless a plot can be written there.

    Checked before the partition is read, so a typo does not end in a traceback after the report.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    formats = FigureCanvasAgg(Figure()).get_supported_filetypes()
    fmt = path.suffix[1:].lower()
    if fmt not in formats:
        what = f"unknown image format {path.suffix!r}" if fmt else "no image format suffix"
        raise FormatError(path, f"{what} (use one of: {', '.join(sorted(formats))})")
    if path.is_dir():
        raise FormatError(path, "is a directory, expected an image file name")
    parent = path.parent
    if not parent.is_dir():
        raise FormatError(path, f"directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise FormatError(path, f"directory {parent} is not writable")
    return fmt


def draw_report(r: dict):
    """The per-part figure of a partition report: estimated compute and communication per layer above, halo
    and send rows below, each stacked per part with its mean and max. Legends sit above their panels, outside
    the data; the parts' axis has whole-number ticks (every part up to ``g3mpi.plotting.TICK_EVERY_BAR``).
    Returns the Figure."""
    parts = r["parts"]
    P = len(parts)
    # 0.35 inch per part up to 40 parts; beyond, the figure stays PLOT_MAX_INCHES wide and the bars get thinner
    width = min(PLOT_MAX_INCHES, max(6, 0.35 * P + 2))
    fig = figure(width, 6.5)
    fig.suptitle(f"{Path(r['path']).name}: {r['method']}, {r['num_parts']} part{'' if r['num_parts'] == 1 else 's'}")
    ax1, ax2 = fig.subplots(2, 1, sharex=True)
    compute = np.array([1e3 * s["est_compute_seconds"] for s in parts], dtype=float)
    comm = np.array([1e3 * s["est_comm_seconds"] for s in parts], dtype=float)
    halo = np.array([s["halo"] for s in parts], dtype=float)
    send = np.array([s["send"] for s in parts], dtype=float)
    for ax, lower, upper, labels, unit, ylabel in (
            (ax1, compute, comm, ("compute", "communication"), "ms", "est. ms per layer"),
            (ax2, halo, send, ("halo rows (recv)", "send rows"), "rows", "halo + send rows")):
        handles = stacked(ax, [lower, upper], labels) + mean_max(ax, lower + upper, unit, "part")
        ax.set_ylabel(ylabel)
        # one row of four entries, two rows of two on the narrowest figures
        legend_above(ax, handles, ncol=4 if width >= 9 else 2)
    index_axis(ax2, P, "part")
    return fig


def plot_report(r: dict, out_png: Path) -> None:
    """Draw the per-part bars (:func:`draw_report`) into ``out_png`` (format from its suffix), written
    atomically."""
    out_png = Path(out_png)
    fmt = check_plot_path(out_png)
    fig = draw_report(r)
    try:
        with atomic_file(out_png, force=True) as tmp:
            fig.savefig(tmp, dpi=100, format=fmt)
    except (OSError, RuntimeError, ValueError) as e:   # e.g. pgf without a LaTeX installation
        raise FormatError(out_png, f"cannot write the plot: {e}") from None


def main(argv=None) -> int:
    """``g3-inspect`` (its parser and main live in :mod:`data_tools.cli`; this name stays for scripts installed
    before)."""
    from .cli import inspect_main
    return inspect_main(argv)


if __name__ == "__main__":
    sys.exit(main())
