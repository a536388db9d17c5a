"""Dropout whose masks depend on (seed, epoch, layer, ORIGINAL node ID), never on a rank's local numbering.

A counter-based hash (murmur3's 32-bit finaliser per node, splitmix64 per group of four features, on numpy
unsigned integers whose arithmetic wraps by definition; little-endian 16-bit lanes) turns
each key into a uniform 32-bit integer, so every rank draws the same mask for the same node whatever the
partition, and P = 1 and P = 4 train the same model.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_U = np.uint32
_U64 = np.uint64
_GOLDEN = _U(0x9E3779B1)


def fmix32(x: np.ndarray) -> np.ndarray:
    """murmur3 32-bit finaliser (in place on a uint32 array, which it returns)."""
    x ^= x >> _U(16)
    x *= _U(0x85EBCA6B)
    x ^= x >> _U(13)
    x *= _U(0xC2B2AE35)
    x ^= x >> _U(16)
    return x


def _mix(h: np.ndarray, v) -> np.ndarray:
    h = h ^ np.asarray(v, dtype=np.uint64).astype(_U)
    h *= _U(5)
    h += _U(0xE6546B64)
    return fmix32(h)


@dataclass(frozen=True)
class DropoutKey:
    """The randomness of one forward pass: run seed and epoch (training step)."""

    seed: int
    epoch: int

    def row_keys(self, layer: int, salt: int, ids) -> np.ndarray:
        """A uint32 key per node for (seed, epoch, layer, salt); ``ids`` are original node IDs (int64)."""
        ids = np.asarray(ids, dtype=np.int64).view(np.uint64)
        h = np.full(len(ids), 0x3C6EF372, dtype=_U)
        for v in (self.seed & 0xFFFFFFFF, (self.seed >> 32) & 0xFFFFFFFF, self.epoch & 0xFFFFFFFF, layer, salt):
            h = _mix(h, np.uint64(v))
        h = _mix(h, ids & np.uint64(0xFFFFFFFF))
        return _mix(h, ids >> np.uint64(32))


#: rows of a keep mask or a float mask made at a time by node dropout (its temporaries stay a few MB)
MASK_ROWS = 1 << 16


def _keep(rk: np.ndarray, width: int, p: float, first: int = 0) -> torch.Tensor:
    """Row keys [n] -> bool mask [n, width] of the kept entries of columns ``first .. first+width-1`` (``first`` a
    multiple of 4). One splitmix64 finaliser per row key and group of four columns gives four 16-bit uniforms
    (resolution 2^-16 on p), so a column range's mask is that range of the whole mask."""
    if first % 4:
        raise ValueError(f"dropout mask columns must start at a multiple of 4, not {first}")
    groups = (width + 3) // 4
    g0 = first // 4
    thr = np.uint16(min(int(round(p * 65536)), 65535))
    step = np.arange(g0 + 1, g0 + groups + 1, dtype=np.uint64) * _U64(0x9E3779B97F4A7C15)
    keep = np.empty((len(rk), width), dtype=bool)
    # by blocks of rows: the uint64 hash and its temporaries (8x the bool mask each) stay a few MB
    for a in range(0, len(rk), MASK_ROWS):
        z = rk[a:a + MASK_ROWS].astype(np.uint64)[:, None] * _U64(0x100000001B3) + step[None, :]
        z ^= z >> _U64(30)
        z *= _U64(0xBF58476D1CE4E5B9)
        z ^= z >> _U64(27)
        z *= _U64(0x94D049BB133111EB)
        z ^= z >> _U64(31)
        np.greater_equal(z.view(np.uint16).reshape(len(z), 4 * groups)[:, :width], thr, out=keep[a:a + MASK_ROWS])
    return torch.from_numpy(keep)


def _scaled(keep: torch.Tensor, p: float, dtype=torch.float32) -> torch.Tensor:
    """Bool mask -> float mask: 1/(1-p) where kept, 0 where dropped (bf16-mixed: in bfloat16, whose product
    with bfloat16 rows runs at bfloat16's speed; a float32 mask would make it a slow mixed-type product)."""
    if dtype != torch.float32:   # (bfloat16's masked_fill_ is slow: 2x a conversion and a product here)
        return keep.to(dtype).mul_(1.0 / (1.0 - p))
    return torch.zeros(keep.shape, dtype=dtype).masked_fill_(keep, 1.0 / (1.0 - p))


def _mask(rk: np.ndarray, width: int, p: float) -> torch.Tensor:
    """Row keys [n] -> float mask [n, width] (:func:`_keep`, scaled)."""
    return _scaled(_keep(rk, width, p), p)


def _times_mask(x: torch.Tensor, keep: torch.Tensor, p: float) -> torch.Tensor:
    """``x * _scaled(keep, p)``, the float mask made :data:`MASK_ROWS` rows at a time (the same products)."""
    out = torch.empty(x.shape, dtype=torch.result_type(x, torch.ones((), dtype=torch.float32)))
    for a in range(0, x.shape[0], MASK_ROWS):
        torch.mul(x[a:a + MASK_ROWS], _scaled(keep[a:a + MASK_ROWS], p,
                                               torch.bfloat16 if x.dtype == torch.bfloat16 else torch.float32),
                  out=out[a:a + MASK_ROWS])
    return out


class _NodeDropout(torch.autograd.Function):
    """``x * mask`` with the float mask of ``keep``, keeping only the bool mask for backward (1 byte an entry,
    not 4); both ways compute the products ``x * mask`` and ``grad * mask`` that autograd's ``mul`` does."""

    @staticmethod
    def forward(ctx, x, keep, p):
        if ctx.needs_input_grad[0]:
            ctx.save_for_backward(keep)
            ctx.p = p
        return _times_mask(x, keep, p)

    @staticmethod
    def backward(ctx, g):
        keep, = ctx.saved_tensors
        return _times_mask(g, keep, ctx.p), None, None


def keep_mask(key: DropoutKey, layer: int, salt: int, ids, width: int, p: float) -> torch.Tensor:
    """Float mask [len(ids), width]: 1/(1-p) where kept, 0 where dropped."""
    return _mask(key.row_keys(layer, salt, ids), width, p)


def edge_keep_mask(key: DropoutKey, layer: int, dst_ids, src_ids, heads: int, p: float) -> torch.Tensor:
    """Float mask [E, heads] for edges (src -> dst), keyed by both endpoints' original IDs."""
    src = np.asarray(src_ids, dtype=np.int64).view(np.uint64)
    rk = key.row_keys(layer, 0x5EED, dst_ids)
    rk = _mix(_mix(rk, src & np.uint64(0xFFFFFFFF)), src >> np.uint64(32))
    return _mask(rk, heads, p)


def node_dropout(x: torch.Tensor, key: DropoutKey | None, layer: int, ids, p: float,
                 training: bool, first: int = 0) -> torch.Tensor:
    """Dropout of node features ``x`` [n, F] whose rows are the nodes ``ids`` (original IDs); ``x`` may be the
    columns ``first ..`` of the layer's input (``first`` a multiple of 4): the same values as those columns of
    the whole input's dropout."""
    if not training or p <= 0 or key is None:
        return x
    return _NodeDropout.apply(x, _keep(key.row_keys(layer, 0, ids), x.shape[1], p, first), p)
