"""The gradient allreduce runs bucket by bucket during backward and sums exactly what one Allreduce sums."""
from __future__ import annotations

import pytest
import torch

from tests.conftest import run_mpi

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


@pytest.mark.parametrize("P", [1, 3])
def test_bucketed_allreduce_equals_plain(P):
    assert "gradsync ok" in run_mpi(P, "tests.mpi_gradsync", timeout=120).stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("P", [1, 2])
def test_allreduce_from_device_memory(P):
    """Parameters on the GPU (the ranks share it): staged through pinned host memory, and, where the MPI reports
    CUDA support, the device buffer handed to MPI."""
    from g3mpi.train.device import mpi_cuda_support
    assert "gradsync ok" in run_mpi(P, "tests.mpi_gradsync", "cuda", timeout=120).stdout
    if mpi_cuda_support():
        assert "gradsync ok" in run_mpi(P, "tests.mpi_gradsync", "cuda", "direct", timeout=120).stdout


def test_parameters_on_several_devices_are_refused():
    from mpi4py import MPI

    from g3mpi.train.gradsync import GradSync
    with pytest.raises(ValueError, match="several devices"):
        GradSync(MPI.COMM_SELF, [[torch.nn.Parameter(torch.ones(1))],
                                 [torch.nn.Parameter(torch.ones(1, device="meta"))]])
