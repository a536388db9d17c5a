"""Halo exchange: rows and gradients land where they belong, bytes equal the halo, simulated network delays."""
from __future__ import annotations

import pytest

from g3mpi.comm import SimNet, parse_sim_net
from g3mpi.comm.simnet import parse_bandwidth, parse_latency
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph


@pytest.mark.parametrize("P,simnet", [(1, None), (3, None), (4, "1Gbit,5ms")])
def test_exchange_both_directions(P, simnet, tmp_path):
    partition(random_graph(n=90, seed=5), P, tmp_path / "parts", seed=5)
    run_mpi(P, "tests.mpi_comm", tmp_path / "parts", *(["--sim-net", simnet] if simnet else []))


def test_parse_sim_net():
    assert parse_sim_net("10Gbit,20us") == (1.25e9, pytest.approx(20e-6))
    assert parse_bandwidth("100Mbit/s") == 12.5e6
    assert parse_bandwidth("2GB") == 2e9
    assert parse_bandwidth("1KiB") == 1024
    assert parse_latency("1.5ms") == pytest.approx(1.5e-3)
    assert parse_latency("0") == 0
    for bad in ("10Gbit", "fast,20us", "10Gbit,soon", "-1Gbit,1us", "0Gbit,1us"):
        with pytest.raises(ValueError):
            parse_sim_net(bad)


def test_simnet_link_queues_messages():
    net = SimNet(bandwidth=1e6, latency=0.01)            # 1 MB/s, 10 ms
    a = net.arrival(1000, 0.0)                            # busy until 1 ms, visible at 11 ms
    b = net.arrival(1000, 0.0)                            # queues behind the first
    c = net.arrival(1000, 1.0)                            # link idle again
    assert a == pytest.approx(0.011) and b == pytest.approx(0.012) and c == pytest.approx(1.011)
