"""Dropout whose masks depend on (seed, epoch, layer, ORIGINAL node ID), never on a rank's local numbering.

A counter-based hash (murmur3's 32-bit finaliser, evaluated in int64 tensors) turns each key into a uniform
32-bit integer, so every rank draws the same mask for the same node whatever the partition, and P = 1 and
P = 4 train the same model.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

_M = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1


def fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3 finaliser on values in [0, 2^32) held in int64 (products wrap; the low 32 bits are exact)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M
    return x ^ (x >> 16)


def _mix(h: torch.Tensor, v) -> torch.Tensor:
    return fmix32((h ^ (torch.as_tensor(v, dtype=torch.int64) & _M)) * 5 + 0xE6546B64 & _M)


@dataclass(frozen=True)
class DropoutKey:
    """The randomness of one forward pass: run seed and epoch (training step)."""

    seed: int
    epoch: int

    def row_keys(self, layer: int, salt: int, ids: torch.Tensor) -> torch.Tensor:
        """A 32-bit key per node for (seed, epoch, layer, salt); ``ids`` are original node IDs (int64)."""
        h = torch.full_like(ids, 0x3C6EF372)
        for v in (self.seed, self.seed >> 32, self.epoch, layer, salt):
            h = _mix(h, int(v) & _M)
        h = _mix(h, ids & _M)
        return _mix(h, ids >> 32)


def keep_mask(key: DropoutKey, layer: int, salt: int, ids: torch.Tensor, width: int, p: float) -> torch.Tensor:
    """Float mask [len(ids), width] with 1/(1-p) where kept and 0 where dropped."""
    rk = key.row_keys(layer, salt, ids)
    cols = (torch.arange(width, dtype=torch.int64) * _GOLDEN) & _M
    u = fmix32((rk.unsqueeze(1) + cols.unsqueeze(0)) & _M)
    return (u >= int(p * 2**32)).to(torch.float32) / (1.0 - p)


def edge_keep_mask(key: DropoutKey, layer: int, dst_ids: torch.Tensor, src_ids: torch.Tensor, heads: int,
                   p: float) -> torch.Tensor:
    """Float mask [E, heads] for edges (src -> dst), keyed by both endpoints' original IDs."""
    rk = key.row_keys(layer, 0x5EED, dst_ids)
    rk = _mix(_mix(rk, src_ids & _M), src_ids >> 32)
    cols = (torch.arange(heads, dtype=torch.int64) * _GOLDEN) & _M
    u = fmix32((rk.unsqueeze(1) + cols.unsqueeze(0)) & _M)
    return (u >= int(p * 2**32)).to(torch.float32) / (1.0 - p)


def node_dropout(x: torch.Tensor, key: DropoutKey | None, layer: int, ids: torch.Tensor, p: float,
                 training: bool) -> torch.Tensor:
    """Dropout of node features ``x`` [n, F] whose rows are the nodes ``ids`` (original IDs)."""
    if not training or p <= 0 or key is None:
        return x
    return x * keep_mask(key, layer, 0, ids, x.shape[1], p)
