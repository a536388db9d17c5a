"""Every HDF5 file g3mpi writes is a real HDF5 file that the HDF5 command-line tools read (h5ls -r)."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import run_module, skip_or_fail

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)

H5LS = shutil.which("h5ls")


@pytest.fixture(autouse=True)
def needs_h5ls():
    if H5LS is None:
        skip_or_fail("h5ls not installed (Debian package hdf5-tools; jobs/test.sh installs it when run as root)")


def h5ls(path) -> str:
    p = subprocess.run([H5LS, "-r", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, f"h5ls -r {path} failed: {p.stderr}"
    return p.stdout


def test_h5ls_reads_graph_parts_and_predictions(tmp_path, cora_npz):
    g = tmp_path / "cora.h5"
    run_module("data_tools.prepare", "npz", cora_npz, "--normalize-features", "--out", g)
    out = h5ls(g)
    for name in ("/indptr", "/indices", "/features", "/labels", "/train_mask", "/val_mask", "/test_mask"):
        assert name in out, out
    assert "{2708, 1433}" in out and "{10556}" in out and "{2709}" in out, out

    parts = tmp_path / "parts"
    run_module("data_tools.partition", g, "--parts", "1", "--method", "metis", "--out", parts)
    out = h5ls(parts / "part-00000.h5")
    for name in ("/indptr", "/indices", "/halo_ids", "/send_rows", "/in_degree", "/features", "/orig_ids"):
        assert name in out, out
    assert "/new_to_orig" in h5ls(parts / "node_map.h5")

    run = tmp_path / "run"
    run_module("g3mpi.cli.train", "--parts", parts, "--out", run, "--epochs", "2", "--no-progress")
    out = h5ls(run / "predictions.h5")
    assert "/logits" in out and "{2708, 7}" in out and "/pred" in out, out
