"""The gradient allreduce runs bucket by bucket during backward and sums exactly what one Allreduce sums."""
from __future__ import annotations

import pytest

from tests.conftest import run_mpi

pytestmark = pytest.mark.slow  # every test here takes more than 1 s (README: Tests)


@pytest.mark.parametrize("P", [1, 3])
def test_bucketed_allreduce_equals_plain(P):
    assert "gradsync ok" in run_mpi(P, "tests.mpi_gradsync", timeout=120).stdout
