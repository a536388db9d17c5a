"""Every built-in model's logits and gradients equal, bit for bit, the values saved from main before the model
registry and the propagation steps as layers (tests/data/golden_models.npz, made by tests/mpi_golden.py on
``random_graph(n=60)`` at P = 1 and 2): a refactoring of how models are built changes no number."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import run_mpi
from tests.graphs import partition, random_graph

SLOW_TESTS = ("test_models_equal_saved",)
SAVED = Path(__file__).parent / "data" / "golden_models.npz"


@pytest.mark.parametrize("P", [1, 2])
def test_models_equal_saved(P, tmp_path):
    from tests.mpi_golden import GOLDEN
    partition(random_graph(n=60, seed=3), P, tmp_path / "parts")
    run_mpi(P, "tests.mpi_golden", tmp_path / "parts", tmp_path / "out.npz")
    got, saved = np.load(tmp_path / "out.npz"), np.load(SAVED)
    mine = {k[len(f"P{P}/"):] for k in saved.files if k.startswith(f"P{P}/")}
    assert {k.split("/")[0] for k in mine} == set(GOLDEN)
    assert set(got.files) == mine
    for k in sorted(mine):
        assert torch.equal(torch.from_numpy(got[k]), torch.from_numpy(saved[f"P{P}/{k}"])), f"P={P}: {k} changed"
