"""data_tools.write_graph: a graph held as arrays or tensors (a PyG Data) written to graph.h5, checked and written
as g3-prepare npz checks and writes an archive of the same arrays."""
from __future__ import annotations

import os
import re

import numpy as np
import pytest

from data_tools import write_graph
from data_tools.importers.common import PrepareOptions, write_raw_graph
from data_tools.importers.npz import load_npz
from g3mpi.format import FormatError, load_graph
from g3mpi.format.features import widen
from tests.conftest import REPO

SLOW_TESTS = ("test_prepare_md_pyg_example",)

MASKS = ("train_mask", "val_mask", "test_mask")


def arrays(n=30, m=90, f=4, seed=0):
    rng = np.random.default_rng(seed)
    a = dict(edge_index=rng.integers(0, n, size=(2, m)), x=rng.standard_normal((n, f)).astype(np.float32),
             y=rng.integers(0, 3, n))
    split = rng.permutation(n)
    for k, idx in zip(MASKS, (split[:10], split[10:18], split[18:])):
        a[k] = np.zeros(n, dtype=bool)
        a[k][idx] = True
    return a


def via_npz(tmp_path, a, name="ref.h5"):
    np.savez(tmp_path / "g.npz", **a)
    write_raw_graph(tmp_path / name, load_npz(tmp_path / "g.npz"), PrepareOptions(quiet=True))
    return tmp_path / name


def same_graph(a, b):
    ga, gb = load_graph(a), load_graph(b)
    for k in ("indptr", "indices", "features", "labels", *MASKS):
        np.testing.assert_array_equal(getattr(ga, k), getattr(gb, k), err_msg=k)


def pyg_example() -> str:
    """The PyG example of docs/PREPARE.md ("From Python"), as written there."""
    text = (REPO / "docs" / "PREPARE.md").read_text(encoding="utf-8")
    block = re.search(r"## From Python.*?```python\n(.*?)```", text, re.S)
    assert block, "docs/PREPARE.md has no python block under 'From Python'"
    return block.group(1)


def test_prepare_md_pyg_example(tmp_path, monkeypatch):
    torch = pytest.importorskip("torch")
    from torch_geometric.data import Data
    a = arrays()
    data = Data(x=torch.from_numpy(a["x"]), edge_index=torch.from_numpy(a["edge_index"]),
                y=torch.from_numpy(a["y"]), **{k: torch.from_numpy(a[k]) for k in MASKS})
    monkeypatch.chdir(tmp_path)
    exec(pyg_example(), {"data": data})
    same_graph(tmp_path / "graph.h5", via_npz(tmp_path, a))


def test_numpy_arrays_and_options(tmp_path):
    a = arrays(seed=1)
    s = write_graph(tmp_path / "g.h5", a["edge_index"], a["x"], a["y"], {k: a[k] for k in MASKS})
    assert s["num_nodes"] == 30 and s["train"] == 10
    same_graph(tmp_path / "g.h5", via_npz(tmp_path, a))
    # no labels and no masks: a graph without a split (as g3-prepare npz with edge_index and x only)
    s = write_graph(tmp_path / "u.h5", a["edge_index"], a["x"], symmetrize=True, normalize_features=True)
    g = load_graph(tmp_path / "u.h5")
    assert g.attrs["symmetric"] and s["train"] == 0 and (g.labels == -1).all()


@pytest.mark.parametrize("edit", ["index", "nan", "labels", "mask"])
def test_rejects_what_the_importer_rejects(tmp_path, edit):
    """Out-of-range index, NaN feature, labels or a mask of another length: write_graph raises the npz importer's
    message (naming its output instead of the archive) and leaves nothing in the directory."""
    a = arrays(seed=2)
    if edit == "index":
        a["edge_index"][1, 7] = 30
    elif edit == "nan":
        a["x"][4, 2] = np.nan
    elif edit == "labels":
        a["y"] = a["y"][:-1]
    else:
        a["val_mask"] = a["val_mask"][:-2]
    np.savez(tmp_path / "g.npz", **a)
    with pytest.raises(FormatError) as want:
        load_npz(tmp_path / "g.npz")
    (tmp_path / "g.npz").unlink()
    out = tmp_path / "g.h5"
    with pytest.raises(FormatError) as got:
        write_graph(out, a["edge_index"], a["x"], a["y"], {k: a[k] for k in MASKS})
    assert str(got.value) == str(want.value).replace(str(tmp_path / "g.npz"), str(out))
    assert os.listdir(tmp_path) == []


def test_tensor_dtypes(tmp_path):
    """bfloat16 and float16 tensors (widened exactly) and int32 edge indices are taken as they are."""
    torch = pytest.importorskip("torch")
    a = arrays(seed=3)
    x16 = torch.from_numpy(a["x"]).to(torch.bfloat16)
    write_graph(tmp_path / "b.h5", torch.from_numpy(a["edge_index"]).int(), x16, torch.from_numpy(a["y"]))
    g = load_graph(tmp_path / "b.h5")
    assert g.feature_dtype == "bfloat16" and g.features.dtype == np.uint16     # kept as given
    np.testing.assert_array_equal(widen(g.features, "bfloat16"), x16.float().numpy())
    np.testing.assert_array_equal(g.features, x16.view(torch.int16).numpy().view(np.uint16))
    write_graph(tmp_path / "h.h5", a["edge_index"], torch.from_numpy(a["x"]).half(), feature_dtype="float32")
    g = load_graph(tmp_path / "h.h5")
    assert g.feature_dtype == "float32"
    np.testing.assert_array_equal(g.features, a["x"].astype(np.float16).astype(np.float32))
    with pytest.raises(TypeError, match="edge_index must be an array"):
        write_graph(tmp_path / "c.h5", [[0], [1]], a["x"])
