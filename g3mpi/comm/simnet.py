"""The network models of the halo exchange: ``DirectNet`` (a message lands when MPI completes it) and ``SimNet``, a
simulated network for measuring overlap on one machine, where shared-memory MPI is nearly free.

A ``Transfer`` (``g3mpi.comm.halo``) is given one model at construction and asks it three things: the stamp
buffers that travel beside its messages (none for ``DirectNet``), the stamp of a message it sends, and when a
message whose data MPI has delivered becomes visible.

``--sim-net BANDWIDTH,LATENCY`` (e.g. ``10Gbit,20us``): a message posted at time t on a rank whose outgoing
link is free from time f becomes visible to its receiver at ``max(t, f) + size / bandwidth + latency``; the
link is then busy until ``max(t, f) + size / bandwidth`` (one outgoing link per rank: messages queue). The
data itself travels by MPI at once, together with its arrival time; the receiver treats the message as
landed only when the clock has passed that time. The delay is real (the receiver sleeps or keeps computing)
and measured with ``time.perf_counter`` (CLOCK_MONOTONIC on Linux), which all processes on one machine share,
so the simulation is meant for ranks on one node.
"""
from __future__ import annotations

import numpy as np

from g3mpi.units import parse_bandwidth, parse_latency

#: the simulated network's range: slower links or longer latencies only stall an epoch for minutes (its delays
#: are sleeps, which neither --comm-timeout nor a stop signal interrupts) or overflow the clock
SIM_MIN_BANDWIDTH = 1e3      # bytes per second
SIM_MAX_LATENCY = 1.0        # seconds


def parse_sim_net(text: str) -> tuple[float, float]:
    """'10Gbit,20us' -> (bytes per second, seconds), within ``SIM_MIN_BANDWIDTH`` and ``SIM_MAX_LATENCY``."""
    parts = [p for p in str(text).split(",")]
    if len(parts) != 2:
        raise ValueError(f"--sim-net {text!r}: expected BANDWIDTH,LATENCY such as 10Gbit,20us")
    bw, lat = parse_bandwidth(parts[0]), parse_latency(parts[1])
    if not bw >= SIM_MIN_BANDWIDTH or not 0 <= lat <= SIM_MAX_LATENCY:
        raise ValueError(f"--sim-net {text!r}: the simulated network takes a bandwidth of at least "
                         f"{SIM_MIN_BANDWIDTH:g} bytes/s and a latency of at most {SIM_MAX_LATENCY:g} s")
    return bw, lat


class DirectNet:
    """No simulation: a message is visible as soon as MPI has delivered it, and no stamps travel."""

    def stamps(self, n: int) -> list:
        return []

    def stamp(self, stamps: list, i: int, nbytes: int, t_post: float) -> None:
        pass

    def visible(self, stamps: list, i: int, t_data: float) -> float:
        return t_data


class SimNet:
    """One rank's outgoing link: computes when each message it sends becomes visible to its receiver.

    ``jitter`` adds a uniform random extra delay in [0, jitter) seconds per message (for tests of arbitrary
    completion orders); ``seed`` makes it reproducible per rank.
    """

    def __init__(self, bandwidth: float, latency: float, jitter: float = 0.0, seed: int = 0):
        self.bandwidth = float(bandwidth)
        self.latency = float(latency)
        self.jitter = float(jitter)
        self._rng = np.random.default_rng(seed)
        self._link_free = 0.0

    def stamps(self, n: int) -> list:
        """One arrival stamp per message (simulation only; not counted as bytes)."""
        return [np.zeros(1) for _ in range(n)]

    def stamp(self, stamps: list, i: int, nbytes: int, t_post: float) -> None:
        stamps[i][0] = self.arrival(nbytes, t_post)

    def visible(self, stamps: list, i: int, t_data: float) -> float:
        """At the simulated arrival, but never before the data really arrived."""
        return max(float(stamps[i][0]), t_data)

    @classmethod
    def from_spec(cls, spec: str | None, jitter: float = 0.0, seed: int = 0) -> "SimNet | None":
        if not spec:
            return SimNet(float("inf"), 0.0, jitter, seed) if jitter > 0 else None
        bw, lat = parse_sim_net(spec)
        return cls(bw, lat, jitter, seed)

    def arrival(self, nbytes: int, t_post: float) -> float:
        start = max(t_post, self._link_free)
        self._link_free = start + nbytes / self.bandwidth
        extra = self._rng.random() * self.jitter if self.jitter > 0 else 0.0
        return self._link_free + self.latency + extra
