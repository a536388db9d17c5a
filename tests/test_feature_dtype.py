"""Features kept in their stored dtype (float16, bfloat16) from g3-prepare through the part files, widened to
float32 only by training: the same partition and the same trained model, bit for bit, as the float32 import of the
same values."""
from __future__ import annotations

import h5py
import numpy as np
import pytest

from data_tools import write_graph
from g3mpi.format import FormatError, GraphWriter, load_graph, read_meta, read_part
from g3mpi.format.features import narrow, widen
from tests.conftest import run_module, run_mpi
from tests.partition_graphs import partition

SLOW_TESTS = ("test_half_features_partition_and_train_like_float32", "test_prepare_feature_dtype_option",
              "test_narrow_and_widen_are_exact_round_trips", "test_float16_underflow_refused_unless_allowed")

MASKS = ("train_mask", "val_mask", "test_mask")


def arrays(n=80, m=400, f=6, seed=0):
    rng = np.random.default_rng(seed)
    e = rng.integers(0, n, size=(2, m))
    x = (rng.standard_normal((n, f)) * 3).astype(np.float32)
    y = rng.integers(0, 3, n)
    split = rng.permutation(n)
    masks = {k: np.isin(np.arange(n), idx) for k, idx in zip(MASKS, (split[:40], split[40:60], split[60:]))}
    return e, x, y, masks


def test_narrow_and_widen_are_exact_round_trips():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((100, 7)) * 100).astype(np.float32)
    for name, torch_dtype in (("float16", "float16"), ("bfloat16", "bfloat16")):
        torch = pytest.importorskip("torch")
        want = torch.from_numpy(x).to(getattr(torch, torch_dtype)).float().numpy()   # torch's rounding
        stored = narrow(x, name)
        np.testing.assert_array_equal(widen(stored, name), want)
        np.testing.assert_array_equal(narrow(widen(stored, name), name), stored)   # exact both ways
    np.testing.assert_array_equal(widen(narrow(x, "float32"), "float32"), x)


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_graph_file_keeps_the_dtype(tmp_path, name):
    e, x, y, masks = arrays()
    write_graph(tmp_path / "h.h5", e, x, y, masks, feature_dtype=name)
    write_graph(tmp_path / "w.h5", e, widen(narrow(x, name), name), y, masks)
    h, w = load_graph(tmp_path / "h.h5"), load_graph(tmp_path / "w.h5")
    assert h.feature_dtype == name and w.feature_dtype == "float32"
    assert h.features.dtype == (np.float16 if name == "float16" else np.uint16)
    np.testing.assert_array_equal(widen(h.features, name), w.features)
    with h5py.File(tmp_path / "h.h5") as f:
        assert f.attrs["feature_dtype"] == name and f["features"].dtype.itemsize == 2


def test_values_beyond_the_half_range_are_refused(tmp_path):
    e, x, y, masks = arrays()
    x[5, 2] = 70000.0                               # float16's largest is 65504
    with pytest.raises(FormatError, match=r"h.h5: features of node 5 are beyond float16's range \(column 2: 70000"):
        write_graph(tmp_path / "h.h5", e, x, y, masks, feature_dtype="float16")
    assert not (tmp_path / "h.h5").exists()
    with pytest.raises(FormatError, match="feature_dtype"):
        GraphWriter(tmp_path / "x.h5", num_nodes=1, feature_dim=1, num_classes=1, source="t", feature_dtype="int8")


def test_prepare_feature_dtype_option(tmp_path):
    """npz float16 features stay float16 by default; --feature-dtype narrows float32 ones, or widens."""
    e, x, y, masks = arrays()
    np.savez(tmp_path / "h.npz", edge_index=e, x=x.astype(np.float16), y=y, **masks)
    np.savez(tmp_path / "f.npz", edge_index=e, x=x, y=y, **masks)
    for src, extra, want in (("h.npz", (), "float16"), ("h.npz", ("--feature-dtype", "float32"), "float32"),
                             ("f.npz", ("--feature-dtype", "bfloat16"), "bfloat16"), ("f.npz", (), "float32")):
        run_module("data_tools.prepare", "npz", tmp_path / src, *extra, "--out", tmp_path / "g.h5", "--force", "-q")
        g = load_graph(tmp_path / "g.h5")
        assert g.feature_dtype == want
        base = x.astype(np.float16).astype(np.float32) if src == "h.npz" else x
        np.testing.assert_array_equal(widen(g.features, want), widen(narrow(base, want), want))


@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_half_features_partition_and_train_like_float32(tmp_path, name):
    """metis (serial writer) and stream (parallel writer, features exchanged as 16-bit patterns): part files keep the
    dtype and hold the same values as the float32 import's; 2-rank training gives the same model, bit for bit."""
    e, x, y, masks = arrays(seed=1)
    write_graph(tmp_path / "h.h5", e, x, y, masks, feature_dtype=name)
    write_graph(tmp_path / "w.h5", e, widen(narrow(x, name), name), y, masks)
    method = "metis" if name == "float16" else "stream"
    models = {}
    for g in ("h", "w"):
        if method == "stream":
            run_mpi(2, "data_tools.partition", tmp_path / f"{g}.h5", "--parts", 2, "--method", "stream", "--out",
                    tmp_path / f"{g}-parts", "--no-progress")
        else:
            partition(tmp_path / f"{g}.h5", tmp_path / f"{g}-parts", 2, method, inproc=True)
        assert read_meta(tmp_path / f"{g}-parts")["feature_dtype"] == (name if g == "h" else "float32")
        run_mpi(2, "g3mpi.cli.train", "--parts", tmp_path / f"{g}-parts", "--out", tmp_path / f"{g}-run",
                "--epochs", 3, "--hidden", 8, "--no-progress", "--no-plots", "--log-level", "WARNING")
        models[g] = (tmp_path / f"{g}-run" / "model.pt").read_bytes()
    for p in range(2):
        hp, wp = read_part(tmp_path / "h-parts", p), read_part(tmp_path / "w-parts", p)
        assert hp.feature_dtype == name and hp.features.itemsize == 2
        np.testing.assert_array_equal(hp.orig_ids, wp.orig_ids)
        np.testing.assert_array_equal(widen(hp.features, name), wp.features)
    import io
    import torch
    h, w = (torch.load(io.BytesIO(models[g]), weights_only=True) for g in ("h", "w"))
    assert h.keys() == w.keys() and all(torch.equal(h[k], w[k]) for k in h)


def test_float16_underflow_refused_unless_allowed(tmp_path):
    """Features around 1e-8 stored as float16 would all become zero: refused in one line with the count and the
    first, nothing written; --allow-underflow stores them."""
    from tests.conftest import run_module
    rng = np.random.default_rng(0)
    n = 40
    x = (rng.standard_normal((n, 4)) * 1e-8).astype(np.float32)
    x[0, 1] = 0.5                      # (a value float16 keeps)
    np.savez(tmp_path / "g.npz", edge_index=rng.integers(0, n, (2, 100)), x=x, y=rng.integers(0, 3, n),
             train_mask=np.ones(n, bool), val_mask=np.zeros(n, bool), test_mask=np.zeros(n, bool))
    args = ["npz", tmp_path / "g.npz", "--out", tmp_path / "g.h5", "--feature-dtype", "float16", "-q"]
    p = run_module("data_tools.prepare", *args, check=False)
    flushed = int(((x != 0) & (x.astype(np.float16) == 0)).sum())
    assert p.returncode == 1 and p.stderr.splitlines() == [
        f"g3-prepare: error: {tmp_path / 'g.h5'}: {flushed} non-zero feature values are too small for float16 and "
        f"would be stored as zero (the first: node 0, column 0: {float(x[0, 0]):g}): keep them as float32 "
        "(--feature-dtype float32), scale them, or accept that with --allow-underflow"]
    assert not (tmp_path / "g.h5").exists()
    run_module("data_tools.prepare", *args, "--allow-underflow")
    assert (tmp_path / "g.h5").exists()
