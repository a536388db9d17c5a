"""The structure probe that stands in for the checksum under --no-verify (g3mpi.format.probe)."""
from __future__ import annotations

import shutil

import pytest

from tests.graphs import partition, random_graph
from g3mpi.format import FormatError, part_name, read_part
from g3mpi.format.probe import probe_structure

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_a_crash_is_a_reason_naming_the_signal", "test_a_sound_file_passes",
              "test_errors_without_a_crash_are_left_to_the_reader")


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe") / "p2"
    partition(random_graph(n=120, seed=5), 2, d)
    return d


def _crash_byte(path):
    """The datatype message of the partition_id attribute, damaged so that HDF5 2.0.0 crashes reading it."""
    b = bytearray(path.read_bytes())
    i = b.find(b"partition_id\x00")
    assert i > 0 and b[i + 16:i + 18] == b"\x19\x01", "layout changed"
    b[i + 17] = 0x63
    path.write_bytes(bytes(b))


def test_a_sound_file_passes(parts):
    assert probe_structure(parts / part_name(0)) is None
    read_part(parts, 0, verify=False)


def test_a_crash_is_a_reason_naming_the_signal(parts, tmp_path):
    d = tmp_path / "p2"
    shutil.copytree(parts, d)
    _crash_byte(d / part_name(1))
    why = probe_structure(d / part_name(1))
    assert why is not None and "crashed the HDF5 library (SIGSEGV" in why
    with pytest.raises(FormatError, match="part-00001.h5: its HDF5 structure is damaged"):
        read_part(d, 1, verify=False)
    read_part(d, 0, verify=False)


def test_errors_without_a_crash_are_left_to_the_reader(parts, tmp_path):
    d = tmp_path / "p2"
    shutil.copytree(parts, d)
    path = d / part_name(1)
    path.write_bytes(path.read_bytes()[:1000])
    assert probe_structure(path) is None
    with pytest.raises(FormatError, match="not a readable HDF5 file"):
        read_part(d, 1, verify=False)


def test_a_probe_that_does_not_finish_is_a_reason(parts):
    why = probe_structure(parts / part_name(0), timeout=0.001)
    assert why is not None and "could not be read within 0.001 s" in why
