"""float32's limits on features (g3mpi.format.limits): values beyond 2^64 warned about once, values not finite as
float32 refused with one message, by every reader and writer of features."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from tests.graphs import random_graph
from tests.part_edits import copy, edit_part, graph_file, parts, replace_ds  # noqa: F401 (copy, parts: fixtures)
from g3mpi.format import FormatError, part_name, read_part


@pytest.mark.parametrize("value,warned", [(3e38, True), (-1e20, True), (1e18, False)])
def test_features_too_large_for_float32_training(copy, caplog, value, warned):
    """Finite features beyond 2^64 (1.8e19) pass as valid, with a warning naming the file and the node: training on
    them overflows float32 (left open by the fuzzing campaign: 3e38 ended the run with a non-finite loss naming no
    file; 1e25 froze parameters through infinite Adam moments and exited 0)."""
    def edit(f):
        x = f["features"][()]
        x[3, 2] = value
        replace_ds(f, "features", x)
    edit_part(copy, 1, edit)
    with caplog.at_level("WARNING", logger="g3mpi.format"):
        part = read_part(copy, 1)
    assert part.features[3, 2] == np.float32(value)
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    if warned:
        assert len(said) == 1 and said[0].startswith(f"{copy / part_name(1)}: the features of 1 node(s) reach "
                                                     f"{abs(np.float32(value)):.3g} in magnitude (the first: node "
                                                     f"{part.owned_start + 3}, original ID {part.orig_ids[3]})"), said
    else:
        assert said == []


def large_features_warning(path, nodes: int, peak: float, first: int, orig: int | None = None) -> str:
    """The one line every reader and writer of features logs for values beyond 2^64 (g3mpi.format.LargeFeatures)."""
    return (f"{path}: the features of {nodes} node(s) reach {peak:.3g} in magnitude (the first: node {first}"
            + ("" if orig is None else f", original ID {orig}") + "), beyond 2^64 = 1.8e19, whose square float32 "
            "cannot hold: float32 training on them is likely to overflow (g3-train stops if the summed gradients "
            "pass 2^64); scale them, or replace such values (a fill value for missing data?)")


def warnings_in(caplog) -> list[str]:
    said = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    caplog.clear()
    return said


@pytest.mark.parametrize("with_orig_ids", [False, True])
def test_graph_features_too_large_for_float32_training(tmp_path, caplog, monkeypatch, with_orig_ids):
    """Finite features beyond 2^64 were warned about by read_part only: the graph's writer (g3-prepare), load_graph
    and the streaming check (g3-inspect) said nothing. Each now logs the same line once, naming the file, the count
    and the first node, also when the rows lie in different blocks (blocks of 4 rows here)."""
    from g3mpi.format import GraphWriter, load_graph
    from g3mpi.format import graph as graph_module
    from g3mpi.format.graph import check_features
    g = random_graph(n=40, seed=1)
    x = g.features.copy()
    x[9, 1], x[9, 4], x[30, 0], x[31, 5] = -2e20, 5e30, 1e19, 3e25   # 1e19 < 2^64: not counted
    orig = np.arange(40, dtype=np.int64) * 3 + 1000 if with_orig_ids else None
    path = tmp_path / "g.h5"
    want = [large_features_warning(path, 2, np.float32(5e30), 9, None if orig is None else 1027)]
    with caplog.at_level("WARNING", logger="g3mpi.format"):
        with GraphWriter(path, num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="test") as w:
            w.write_csr(g.indptr, g.indices)
            for s in range(0, 40, 4):
                w.write_features(s, x[s:s + 4])
            assert warnings_in(caplog) == []   # not before the file is written
            w.write_nodes(g.labels, g.train_mask, g.val_mask, g.test_mask, orig)
        assert warnings_in(caplog) == want
        np.testing.assert_array_equal(load_graph(path).features, x)
        assert warnings_in(caplog) == want
        assert load_graph(path, features=False).features is None and warnings_in(caplog) == []
        monkeypatch.setattr(graph_module, "STREAM_BYTES", 4 * x.shape[1] * 4)
        with h5py.File(path) as f:
            check_features(path, f["features"], orig)
        assert warnings_in(caplog) == want
        x[[9, 31]] = 1e18
        with GraphWriter(tmp_path / "h.h5", num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="t") as w:
            w.write_csr(g.indptr, g.indices)
            w.write_features(0, x)
            w.write_nodes(g.labels, g.train_mask, g.val_mask, g.test_mask, orig)
        assert warnings_in(caplog) == []


def test_graph_features_not_finite_refused_by_load_graph(tmp_path):
    """load_graph read the features without checking them: NaN passed (g3-partition and g3-inspect, which read
    them themselves, refused them); now they are refused naming the node, unless the features are left in the
    file."""
    from g3mpi.format import load_graph

    def edit(f):
        x = f["features"][()]
        x[17, 2] = np.nan
        replace_ds(f, "features", x)
    path = graph_file(tmp_path, edit)
    with pytest.raises(FormatError, match=r"g.h5: features of node 17 are not finite as float32"):
        load_graph(path)
    assert load_graph(path, features=False).features is None


def test_features_not_finite_one_message_everywhere(copy, tmp_path):
    """Every reader and writer of features refuses a value that is not finite as float32 with one message naming
    the file, the node (an input file's row), the column and the value as stored. Before: three wordings, and
    four checks, by g3-prepare's writer ("features contain NaN or Inf (first at row 13)"), its importers
    ("features contain NaN or Inf (first at row 13, column 2)", "feature 1e+300 at row 13, column 2 does not fit
    in float32"), load_graph and g3-partition ("features of node 17 are not finite as float32 (NaN, Inf or beyond
    float32's range)", the value not shown), a part file's reader ("features contain NaN or Inf", no node)."""
    from data_tools.build import feature_rows
    from data_tools.importers.common import check_features as check_input_features
    from g3mpi.format import GraphWriter, load_graph
    from g3mpi.format.limits import LargeFeatures
    from g3mpi.format.graph import check_features
    why = "NaN, Inf or beyond float32's range)"
    g = random_graph(n=40, seed=1)
    x = g.features.astype(np.float64)
    x[13, 2] = 1e300
    path = tmp_path / "w.h5"
    with pytest.raises(FormatError) as e:     # g3-prepare's writer, given float64 blocks
        with GraphWriter(path, num_nodes=40, feature_dim=x.shape[1], num_classes=3, source="test") as w:
            w.write_csr(g.indptr, g.indices)
            w.write_features(0, x[:8])
            w.write_features(8, x[8:])
    assert str(e.value) == f"{path}: features of node 13 are not finite as float32 (column 2: 1e+300; {why}"
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p2"]
    for bad, shown in ((1e300, "1e+300"), (-np.inf, "-inf"), (np.nan, "nan")):     # g3-prepare's importers
        x[13, 2] = bad
        with pytest.raises(FormatError) as e:
            check_input_features("x.npy", x, 40)
        assert str(e.value) == f"x.npy: features of row 13 are not finite as float32 (column 2: {shown}; {why}"

    def edit(f):
        y = f["features"][()].astype(np.float64)
        y[17, 3] = -1e39
        replace_ds(f, "features", y)
    path = graph_file(tmp_path, edit)
    want = f"{path}: features of node 17 are not finite as float32 (column 3: -1e+39; {why}"
    with pytest.raises(FormatError) as e:     # load_graph
        load_graph(path)
    assert str(e.value) == want
    with h5py.File(path) as f:
        with pytest.raises(FormatError) as e:     # g3-inspect's streaming check
            check_features(path, f["features"])
        assert str(e.value) == want
        with pytest.raises(FormatError) as e:     # g3-partition's copy into the parts
            feature_rows(path, f["features"], 10, 40, LargeFeatures())
        assert str(e.value) == f"{want}: the runtime would refuse the parts"
    part = read_part(copy, 1)

    def edit_part_features(f):
        y = f["features"][()]
        y[3, 1] = np.nan
        replace_ds(f, "features", y)
    edit_part(copy, 1, edit_part_features)
    with pytest.raises(FormatError) as e:     # a part file's reader (the node by its new global ID)
        read_part(copy, 1)
    assert str(e.value) == (f"{copy / part_name(1)}: features of node {part.owned_start + 3} are not finite as "
                            f"float32 (column 1: nan; {why}")
