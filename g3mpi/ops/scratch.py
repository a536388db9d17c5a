"""Storage kept from one epoch to the next for the wide tensors a layer makes anew every epoch at the same sizes
(R-GCN's per-relation messages and their gradients, R x out values a row). A fresh tensor that large is a fresh
mapping from the system (glibc maps every block over its mmap threshold, at most 32 MiB), every page of which
faults on first touch: at R-MAT 20 with 8 relations, about a tenth of R-GCN's epoch. A storage is handed out
again only once nothing references it (no tensor, view or autograd record), so a reuse never aliases a live
tensor."""
from __future__ import annotations

import math

import torch

# (torch's count of the references to a storage; without it, nothing is reused)
_use_count = getattr(torch._C, "_storage_Use_Count", None)


class ScratchPool:
    """Storages of uninitialised tensors (:meth:`empty`), each reused once no reference to it is left."""

    def __init__(self):
        self._held = []     # (one flat tensor per storage, the rows of the tensor it was made for)

    @staticmethod
    def _free(t: torch.Tensor) -> bool:
        # the pool's tensor and the temporary storage object: nothing else
        return _use_count(t.untyped_storage()._cdata) <= 2

    def empty(self, shape, dtype=torch.float32) -> torch.Tensor:
        """An uninitialised contiguous tensor of ``shape``: a view of the smallest free storage large enough, or
        of a new one (the free ones too small for it released: the pool holds no more storages than were in use
        at once)."""
        n = math.prod(shape)
        if _use_count is None:
            return torch.empty(shape, dtype=dtype)
        free = [(t, r) for t, r in self._held if t.dtype == dtype and self._free(t)]
        fits = [t for t, _ in free if t.numel() >= n]
        if fits:
            t = min(fits, key=torch.Tensor.numel)
        else:
            small = {id(t) for t, _ in free}
            self._held = [(u, r) for u, r in self._held if id(u) not in small]
            t = torch.empty(n, dtype=dtype)
            self._held.append((t, shape[0] if shape else 0))
        return t[:n].view(shape)

    def held(self) -> list:
        """(rows of the tensor each storage was made for, its bytes) of every storage held."""
        return [(r, t.numel() * t.element_size()) for t, r in self._held]
