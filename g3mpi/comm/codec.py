"""The dtype of halo messages on the wire (``--halo-dtype``): float32 as computed, or 16 bits a value.

A 16-bit codec gives each message of a ``Transfer`` its own wire buffer of ``uint16`` words: the sender encodes
the message's float32 (or bfloat16) rows into it, the receiver decodes it into its float32 buffer when it lands,
so everything above the transfer (buffers, pieces, schedules) is unchanged. bfloat16 keeps float32's range (8
bits of mantissa); float16 keeps 11 bits but overflows past 65504 and flushes below 6e-8, so each float16 message
carries its own power-of-two scale in a 2-word header (``max |x| / scale`` lands in [2^14, 2^15): no overflow,
and gradients of 1e-9 keep their bits). Non-finite values travel as they are (the trainer's checks see them).
"""
from __future__ import annotations

import math

import numpy as np
import torch

HALO_DTYPES = ("float32", "bfloat16", "float16")

#: float16 words before the values: the message's float32 scale
_HEADER = {"bfloat16": 0, "float16": 2}
#: max |x| of a float16 message after scaling lies in [2^14, 2^15) (float16's largest finite value: 65504)
_F16_TOP = 14


def codec_for(halo_dtype: str) -> "Codec | None":
    """The codec of ``halo_dtype`` (None: float32, the buffers themselves travel)."""
    if halo_dtype not in HALO_DTYPES:
        raise ValueError(f"halo dtype {halo_dtype!r}: expected one of {', '.join(HALO_DTYPES)}")
    return None if halo_dtype == "float32" else Codec(halo_dtype)


class Codec:
    """Encodes [rows, width] float rows into a uint16 wire buffer and back (see the module)."""

    def __init__(self, name: str):
        self.name = name
        self.header = _HEADER[name]
        self.dtype = torch.bfloat16 if name == "bfloat16" else torch.float16

    def wire(self, buf: np.ndarray) -> np.ndarray:
        """A wire buffer for messages shaped like ``buf``."""
        return np.zeros(self.header + buf.size, dtype=np.uint16)

    def _values(self, wire: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(wire[self.header:]).view(self.dtype)

    def encode(self, src, wire: np.ndarray) -> None:
        """Write ``src`` (numpy float32 or a torch float tensor, [rows, width]) into ``wire``."""
        x = torch.from_numpy(src) if isinstance(src, np.ndarray) else src
        vals = self._values(wire).view(x.shape)
        if not self.header:
            vals.copy_(x)
            return
        scale = _f16_scale(x)
        wire[:2] = np.array([scale], dtype=np.float32).view(np.uint16)
        torch.mul(x, 1.0 / scale, out=vals)   # (computed in x's dtype, then rounded: scale is a power of two)

    def decode(self, wire: np.ndarray, dst: np.ndarray) -> None:
        """Write ``wire``'s values into the float32 buffer ``dst``."""
        out = torch.from_numpy(dst)
        out.copy_(self._values(wire).view(out.shape))
        if self.header:
            scale = float(wire[:2].view(np.float32)[0])
            if scale != 1.0:
                out.mul_(scale)


def _f16_scale(x: torch.Tensor) -> float:
    """The power of two that brings ``x``'s largest finite magnitude into [2^14, 2^15) (1 for an empty or zero
    message)."""
    if x.numel() == 0:
        return 1.0
    a = x.detach().abs()
    top = float(a.max())
    if not math.isfinite(top):
        top = float(torch.where(torch.isfinite(a), a, 0).max())
    if top == 0.0:
        return 1.0
    return math.ldexp(1.0, math.frexp(top)[1] - 1 - _F16_TOP)
