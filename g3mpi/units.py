"""Rates and durations written by people: ``--bandwidth`` (g3-partition's cost model) and ``--sim-net`` (the
simulated network) read them here, so both take the same words. No torch, no MPI: data_tools imports it too."""
from __future__ import annotations

import math
import re

_DECIMAL = {"": 1.0, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}
_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_BANDWIDTH = re.compile(r"([0-9.eE+-]+)\s*(?:([kKmMgGtT])(i?))?(bits?|b|B|bytes?)?(?:/s|ps)?")
BANDWIDTH_EXAMPLES = "10Gbit, 10Gbit/s, 100Mbps, 1.25GB, 1GiB/s, or a number of bytes per second such as 1.25e9"


def parse_bandwidth(text: str | float) -> float:
    """A bandwidth -> bytes per second.

    A number, then optionally a prefix (k, M, G, T = 10^3..10^12; Ki, Mi, Gi, Ti = 2^10..2^40), a unit (``bit``,
    ``bits`` or ``b``: bits; ``B``, ``byte`` or ``bytes``: bytes; none: bytes) and ``/s`` or ``ps``:
    '10Gbit' = '10Gbit/s' = '10Gbps' = 1.25e9, '1.25GB' = 1.25e9, '1KiB' = 1024, '1e9' = 1e9. A bare number
    (int or float) is bytes per second. Refused (ValueError naming the text): anything else, and values that
    are not positive and finite."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        bw = float(text)
    else:
        m = _BANDWIDTH.fullmatch(str(text).strip())
        try:
            if m is None:
                raise ValueError
            value, prefix, binary, unit = float(m.group(1)), m.group(2) or "", m.group(3), m.group(4) or "B"
        except ValueError:
            raise ValueError(f"bandwidth {text!r}: expected e.g. {BANDWIDTH_EXAMPLES}") from None
        scale = 1024.0 ** ("kmgt".index(prefix.lower()) + 1) if binary else _DECIMAL[prefix.lower()]
        bw = value * scale * (1 / 8 if unit in ("bit", "bits", "b") else 1)
    if not (bw > 0 and math.isfinite(bw)):
        raise ValueError(f"bandwidth {text!r} must be positive and finite")
    return bw


def parse_latency(text: str) -> float:
    """'20us', '0.5ms', '1e-5s', '0' (seconds when no unit is given) -> seconds, non-negative and finite."""
    m = re.fullmatch(r"([0-9.eE+-]+)\s*(s|ms|us|µs|ns)?", str(text).strip())
    try:
        if m is None:
            raise ValueError
        lat = float(m.group(1)) * _TIME_UNITS[m.group(2) or "s"]
    except ValueError:
        raise ValueError(f"latency {text!r}: expected a number and a unit such as 20us, 1ms") from None
    if not (lat >= 0 and math.isfinite(lat)):
        raise ValueError(f"latency {text!r} must be non-negative and finite")
    return lat
