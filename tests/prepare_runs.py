"""g3-prepare run on bad input for tests/test_prepare_errors*.py: an output directory, the check that the command
failed with one line naming the file and left nothing behind, small npz and OGB-layout inputs."""
from __future__ import annotations

import os

import numpy as np
import pytest

from tests.conftest import run_module


@pytest.fixture
def out_dir(tmp_path):
    d = tmp_path / "out"
    d.mkdir()
    return d


def fails(out_dir, *args, path, words=(), out_name="g.h5"):
    """Run g3-prepare expecting failure; check the message and that out_dir gained nothing."""
    before = sorted(os.listdir(out_dir))
    p = run_module("data_tools.prepare", *args, "--out", out_dir / out_name, check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode != 0, p.stderr
    assert len(lines) == 1, p.stderr
    assert lines[0].startswith(f"g3-prepare: error: {path}"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert "Traceback" not in p.stderr
    assert sorted(os.listdir(out_dir)) == before, "output or temporary files left behind"
    return lines[0]


def cora_like(path, n=6, **over):
    arrays = dict(edge_index=np.array([[0, 1, 2, 3, 4], [1, 2, 3, 4, 5]]), x=np.ones((n, 3), dtype=np.float32),
                  y=np.array([0, 1, 2, 0, 1, 2]), train_mask=np.array([1, 1, 0, 0, 0, 0], dtype=bool),
                  val_mask=np.array([0, 0, 1, 1, 0, 0], dtype=bool), test_mask=np.array([0, 0, 0, 0, 1, 1], dtype=bool))
    arrays.update(over)
    np.savez(path, **arrays)
    return path


def make_ogb(root):
    (root / "raw").mkdir(parents=True)
    (root / "split" / "s").mkdir(parents=True)
    files = {"raw/edge.csv": "0,1\n1,2\n2,3\n", "raw/node-feat.csv": "1,2\n3,4\n5,6\n7,8\n",
             "raw/node-label.csv": "0\n1\n1\n0\n", "raw/num-node-list.csv": "4\n",
             "split/s/train.csv": "0\n1\n", "split/s/valid.csv": "2\n", "split/s/test.csv": "3\n"}
    for name, text in files.items():
        (root / name).write_text(text)
    return root
