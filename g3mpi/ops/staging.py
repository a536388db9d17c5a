"""Host staging of the halo exchange for a rank whose tensors live on a device (issue 28, ``--device cuda``).

MPI sends and receives host buffers (the ``HaloExchange``'s, pinned host memory on a GPU rank: ``pinned_zeros``);
the layers compute on device tensors. One :class:`Staging` per exchange, planned once with it, moves rows
between the two, per direction:

- forward sends: each send neighbour's rows of the payload (a contiguous range sliced, another list gathered
  with its index on the device) are copied into that neighbour's host send buffer on a side stream; the sends are
  queued behind the copy's event (``Transfer.send_after``) and leave once a poll finds it complete;
- forward receives: a landed piece of the halo is copied to the device when a layer asks for it (a tensor of its
  own, as the unstaged path's, since GAT returns it from an autograd function);
- backward sends: each piece of a halo gradient, written in place into the device halo-gradient buffer, is copied
  into the host buffer on the side stream and queued behind its event, piece by piece as the last share writes it;
- backward receives: a landed piece of the gradients for our rows is copied to the device and added there.

The copies are a :class:`CudaCopies` (a side CUDA stream, events) on a GPU, or :class:`HostCopies`, the CPU
standing in (each copy done at once, its event complete): with it a CPU rank runs the whole staged path, which
the tests compare bit for bit with the unstaged one. A rank without staging (every CPU run) never reaches this
module: its layers compute on the exchange's own buffers, as they always have.
"""
from __future__ import annotations

import numpy as np
import torch


class Done:
    """The event of a copy already complete (:class:`HostCopies`)."""

    @staticmethod
    def query() -> bool:
        return True

    @staticmethod
    def synchronize() -> None:
        return None


DONE = Done()


class HostCopies:
    """The CPU standing in for a side stream: each copy runs at once, and its event is complete."""

    device = torch.device("cpu")

    @staticmethod
    def copy(pairs: list) -> Done:
        """Copy each ``(dst, src)`` pair; the event of their completion."""
        for dst, src in pairs:
            dst.copy_(src)
        return DONE


class CudaCopies:
    """Device-to-host copies on a side CUDA stream of ``device``, each batch ordered after the work queued so far on
    the current stream (which computed what it copies) and marked by an event that the send queue polls."""

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.stream = torch.cuda.Stream(self.device)

    def copy(self, pairs: list):
        """Copy each ``(dst, src)`` pair (``dst`` pinned host memory) on the side stream; its ``torch.cuda.Event``."""
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            for dst, src in pairs:
                dst.copy_(src, non_blocking=True)
                src.record_stream(self.stream)   # (its memory is not reused before the copy is done)
            event = torch.cuda.Event()
            event.record(self.stream)
        return event


def pinned_zeros(shape: tuple, dtype) -> np.ndarray:
    """A zero host buffer in pinned (page-locked) memory, as numpy (the array keeps the tensor alive)."""
    return torch.zeros(shape, dtype=torch.from_numpy(np.zeros(0, dtype)).dtype, pin_memory=True).numpy()


class Stager:
    """How a graph stages its exchanges: the device its tensors live on and the copies (``HostCopies`` or
    ``CudaCopies``); ``alloc`` makes the host buffers (pinned on a GPU)."""

    def __init__(self, copies):
        self.copies = copies
        self.device = copies.device
        self.alloc = pinned_zeros if self.device.type == "cuda" else None

    @classmethod
    def for_device(cls, device: torch.device) -> "Stager":
        device = torch.device(device)
        return cls(CudaCopies(device) if device.type == "cuda" else HostCopies())

    def stage(self, ex) -> "Staging":
        """The staging of the exchange ``ex`` (made with ``alloc``), set as ``ex.staging``."""
        ex.staging = Staging(ex, self.device, self.copies)
        return ex.staging


class Staging:
    """The device side of one ``HaloExchange`` (``ex``): the device halo-gradient buffer, the device indices of the
    send lists that are not a contiguous range, and the copies in both directions."""

    def __init__(self, ex, device: torch.device, copies):
        self.ex, self.device, self.copies = ex, torch.device(device), copies
        # per send neighbour: its rows of the payload, (lo, hi) or their index on the device
        self.sources = [r if r is not None else torch.from_numpy(ix).to(self.device)
                        for r, ix in zip(ex.send_ranges, ex.plan.send_idx)]
        self._halo_grad = None

    def start_forward(self, payload: torch.Tensor) -> None:
        """Open the forward round, copy every send neighbour's rows of ``payload`` (device; row i = owned row i)
        into its host send buffer, and queue each piece's send behind that copy."""
        ex = self.ex
        ex.forward.begin()   # (completes the previous round's sends: the buffers are free)
        pairs = []
        for q, src in enumerate(self.sources):
            rows = payload[src[0]:src[1]] if isinstance(src, tuple) else payload.index_select(0, src)
            pairs.append((torch.from_numpy(ex.send_bufs[q]), rows))
        event = self.copies.copy(pairs)
        for msgs in ex.send_msgs:
            for j in msgs:
                ex.forward.send_after(j, event)

    def halo_rows(self, i: int, k: int | None = None) -> torch.Tensor:
        """Neighbour i's halo slice (or its piece k), landed, copied from the host buffer to the device."""
        ex = self.ex
        s = ex.plan.recv_slice(i)
        a, b = s.start, s.stop
        if k is not None:
            bounds = ex.recv_pieces[i]
            a, b = a + int(bounds[k]), a + int(bounds[k + 1])
        return torch.from_numpy(ex.halo[a:b]).to(self.device, copy=True)

    @property
    def halo_grad(self) -> torch.Tensor:
        """The device halo-gradient buffer [num_halo, width] (made on first use, as the host one)."""
        if self._halo_grad is None:
            self._halo_grad = torch.zeros(self.ex.halo_grad.shape, dtype=torch.float32, device=self.device)
        return self._halo_grad

    def send_grad(self, i: int, k: int, j: int) -> None:
        """Copy piece k of neighbour i's halo gradient (device) into the host buffer and queue its send (the
        backward transfer's message j) behind the copy."""
        ex = self.ex
        s, bounds = ex.plan.recv_slice(i), ex.recv_pieces[i]
        a, b = s.start + int(bounds[k]), s.start + int(bounds[k + 1])
        event = self.copies.copy([(torch.from_numpy(ex.halo_grad[a:b]), self.halo_grad[a:b])])
        ex.backward.send_after(j, event)

    def grad_rows(self, q: int, a: int, b: int) -> torch.Tensor:
        """Rows a .. b-1 of the gradients send neighbour q returned for our rows, landed, on the device."""
        return torch.from_numpy(self.ex.grad_bufs[q][a:b]).to(self.device)

    def send_index(self, q: int) -> torch.Tensor:
        """Send neighbour q's rows (``plan.send_idx[q]``) on the device, for a send list that is not a contiguous
        range (the only kind whose returned gradients are added by index)."""
        return self.sources[q]
