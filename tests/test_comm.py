"""Halo exchange: rows and gradients land where they belong, bytes equal the halo, simulated network delays."""
from __future__ import annotations

import pytest

from g3mpi.comm import SimNet, parse_sim_net
from g3mpi.units import parse_bandwidth, parse_latency
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_exchange_both_directions",)


@pytest.mark.parametrize("P,simnet,pieces", [(1, None, 0), (3, None, 0), (4, "1Gbit,5ms", 0), (3, None, 4),
                                             (2, "1Gbit,1ms", 3)])
def test_exchange_both_directions(P, simnet, pieces, tmp_path):
    partition(random_graph(n=90, seed=5), P, tmp_path / "parts", seed=5)
    run_mpi(P, "tests.mpi_comm", tmp_path / "parts", *(["--sim-net", simnet] if simnet else []),
            "--piece-rows", str(pieces))


def test_parse_sim_net():
    assert parse_sim_net("10Gbit,20us") == (1.25e9, pytest.approx(20e-6))
    assert parse_bandwidth("100Mbit/s") == 12.5e6
    assert parse_bandwidth("2GB") == 2e9
    assert parse_bandwidth("1KiB") == 1024
    assert parse_latency("1.5ms") == pytest.approx(1.5e-3)
    assert parse_latency("0") == 0
    for bad in ("10Gbit", "fast,20us", "10Gbit,soon", "-1Gbit,1us", "0Gbit,1us", "1e-300bit,0s", "10Gbit,1000s",
                "1e400GB,0", "10Gbit,infs"):
        with pytest.raises(ValueError):
            parse_sim_net(bad)


@pytest.mark.parametrize("text,bps", [("10Gbit", 1.25e9), ("10Gbit/s", 1.25e9), ("10Gbps", 1.25e9), ("10Gb", 1.25e9),
                                      ("10Gbits", 1.25e9), ("1.25GB", 1.25e9), ("1.25 GB/s", 1.25e9), ("1e9", 1e9),
                                      ("1GiB", 2.0 ** 30), ("8Kibit", 1024), ("100MBps", 1e8), (5e8, 5e8)])
def test_one_bandwidth_parser_for_sim_net_and_partition(text, bps):
    """--sim-net and g3-partition --bandwidth read the same words (two parsers once took different ones: '1e9'
    and '10GiB' each worked in only one, and '1e400GB' passed as infinity in --sim-net)."""
    from g3mpi.comm.simnet import parse_sim_net as simnet
    assert parse_bandwidth(text) == pytest.approx(bps)
    if isinstance(text, str):
        assert simnet(f"{text},0")[0] == pytest.approx(bps)


@pytest.mark.parametrize("text", ["1e400GB", "0", "-5MB", "fast", "10Gbyte/hour", "nan", "inf", "10XB", True])
def test_bandwidth_refused(text):
    with pytest.raises(ValueError, match="bandwidth"):
        parse_bandwidth(text)


def test_simnet_link_queues_messages():
    net = SimNet(bandwidth=1e6, latency=0.01)            # 1 MB/s, 10 ms
    a = net.arrival(1000, 0.0)                            # busy until 1 ms, visible at 11 ms
    b = net.arrival(1000, 0.0)                            # queues behind the first
    c = net.arrival(1000, 1.0)                            # link idle again
    assert a == pytest.approx(0.011) and b == pytest.approx(0.012) and c == pytest.approx(1.011)


def test_backward_buffers_made_on_first_use():
    """An exchange allocates each direction's buffers when that direction is first used: one no gradient flows
    back through (raw input features) never has gradient buffers, one never sent (a kept input halo) none."""
    import numpy as np
    from mpi4py import MPI

    from g3mpi.comm import CommContext, HaloPlan
    # one rank talking to itself: 3 halo rows that are its own rows 0, 2, 4
    plan = HaloPlan(num_owned=5, num_halo=3, recv_parts=[0], recv_offsets=np.array([0, 3]), send_parts=[0],
                    send_idx=[np.array([0, 2, 4])])
    ctx = CommContext(MPI.COMM_SELF)
    try:
        ex = ctx.exchange(plan, 2)
        fwd_bytes = 2 * 3 * 2 * 4
        assert not ex.forward_planned and not ex.backward_planned and ex.buffer_bytes() == 0
        ctx.progress()      # (drives only the planned directions: plans none)
        assert not ex.forward_planned
        ex.forward
        assert ex.forward_planned and not ex.backward_planned and ex.buffer_bytes() == fwd_bytes
        ex.start_forward(np.arange(10, dtype=np.float32).reshape(5, 2))
        ctx.progress()
        ex.forward.wait_all()
        assert not ex.backward_planned
        assert np.array_equal(ex.halo, [[0, 1], [4, 5], [8, 9]])
        ex.halo_grad[:] = 1.0
        assert ex.backward_planned and ex.buffer_bytes() == 2 * fwd_bytes
        ex.backward.begin()
        ex.backward.send_all()
        ex.backward.wait_all()
        assert np.array_equal(ex.grad_bufs[0], np.ones((3, 2)))
    finally:
        ctx.free()


class FakeEvent:
    """A copy's completion as the CPU stands in for a CUDA event: done when the test says so, or when waited for;
    every query and wait is logged."""

    def __init__(self, log: list, name: str):
        self.log, self.name, self.done = log, name, False

    def query(self) -> bool:
        self.log.append(("query", self.name))
        return self.done

    def synchronize(self) -> None:
        self.log.append(("wait", self.name))
        self.done = True


def _self_exchange(ctx, piece_rows=0):
    """An exchange of one rank with itself: 3 halo rows that are its own rows 0, 2, 4, 2 floats wide."""
    import numpy as np

    from g3mpi.comm import HaloPlan
    plan = HaloPlan(num_owned=5, num_halo=3, recv_parts=[0], recv_offsets=np.array([0, 3]), send_parts=[0],
                    send_idx=[np.array([0, 2, 4])])
    return ctx.exchange(plan, 2, piece_rows=piece_rows)


def test_sends_after_events_leave_in_order_once_their_copies_complete():
    """Staged sends (a GPU rank's rows copied to host memory): polls send the queued prefix whose copies have
    completed, never one behind a copy still running; a blocking wait waits for the copies and sends them all."""
    import numpy as np
    from mpi4py import MPI

    from g3mpi.comm import CommContext
    ctx = CommContext(MPI.COMM_SELF)
    log = []
    try:
        ex = _self_exchange(ctx, piece_rows=1)   # three pieces, three messages
        tr = ex.forward
        tr.begin()
        ex.send_bufs[0][:] = [[1, 2], [3, 4], [5, 6]]
        first, second = FakeEvent(log, "first"), FakeEvent(log, "second")
        tr.send_after(0, first)
        tr.send_after(1, second)
        assert not tr.all_started
        tr.send_after(2, second)
        assert tr.all_started and not tr.all_sent
        with pytest.raises(RuntimeError, match="message 2 sent twice"):
            tr.send_after(2, second)
        assert tr.test() == [] and ctx.stats.messages_sent == 0
        second.done = True
        ctx.progress()
        assert ctx.stats.messages_sent == 0 and not tr.all_sent, "a send overtook one whose copy is running"
        first.done = True
        ctx.progress()
        assert ctx.stats.messages_sent == 3 and tr.all_sent and len(ctx.sends) == 0
        assert sorted(tr.wait_all()) == [0, 1, 2] and np.array_equal(ex.halo, [[1, 2], [3, 4], [5, 6]])
        assert ("wait", "first") not in log and ("wait", "second") not in log
        # a blocking wait: every queued copy waited for and sent first (no rank blocks with a message queued)
        tr.begin()
        ex.send_bufs[0][:] = 7
        third = FakeEvent(log, "third")
        for j in range(3):
            tr.send_after(j, third)
        assert sorted(tr.wait_all()) == [0, 1, 2] and ("wait", "third") in log and np.all(ex.halo == 7)
        # queued at the end: freeing sends and completes them
        tr.begin()
        tr.send_after(0, FakeEvent(log, "last"))
        tr.send_after(1, FakeEvent(log, "last"))
        tr.send_after(2, FakeEvent(log, "last"))
    finally:
        ctx.free()
    assert log.count(("wait", "last")) == 3 and ctx.stats.messages_sent == 9


def test_send_after_needs_a_queue():
    import numpy as np
    from mpi4py import MPI

    from g3mpi.comm import Transfer
    from g3mpi.comm.halo import CommStats
    buf = np.zeros((1, 1), np.float32)
    tr = Transfer(MPI.COMM_SELF, [0], [buf], [], [], 5, CommStats())
    try:
        with pytest.raises(RuntimeError, match="needs a send queue"):
            tr.send_after(0, None)
    finally:
        tr.free()
