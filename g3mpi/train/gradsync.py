"""Parameter-gradient allreduce, bucket by bucket, overlapped with the rest of backward.

Parameters are replicated, so after backward every rank needs the sum over ranks of every parameter gradient; the
node-embedding tables (``g3mpi.nn.sharded_parameters``) are not: each rank holds its owned rows, whose gradient
backward's halo exchange has already completed, so they are in no bucket.
Backward produces them last layer first; each layer's parameters form one bucket (a contiguous slice of one
flat float32 buffer). When autograd has accumulated every gradient of a bucket (``post_accumulate_grad``
hooks), the bucket is packed and a non-blocking ``Iallreduce`` starts at once, while backward continues with the
earlier layers (their halo exchanges and sparse products). Buckets start in a fixed order on every rank (a
bucket that is ready early waits for its predecessors), as MPI requires collectives to be issued in the same
order everywhere; ``flush`` starts whatever backward did not reach (parameters without a gradient in this pass).

    sync = GradSync(comm, buckets, watchdog)      # once: buffer, offsets, hooks
    sync.begin(); loss.backward(); sync.flush()    # every step: buckets leave during backward
    ...                                            # other collectives may follow (same order on every rank)
    sync.wait(); sync.unpack()                     # summed gradients back into p.grad

Parameters on a GPU: the flat buffer is pinned host memory, each gradient copied into it as its bucket is packed
(staged), or, with ``direct`` (an MPI that takes CUDA buffers, ``--cuda-aware``), the buffer is on the device and
MPI reduces it there once the stream has finished writing it.
"""
from __future__ import annotations

import torch
from mpi4py import MPI

from g3mpi.nn.embedding import sharded_parameters


def param_buckets(model) -> list[list]:
    """A model's parameters in buckets, in about the order backward completes them: one per layer of a stack
    (``model.convs``), last first, else one per child module in reverse order of definition; the model's own
    parameters and any left last. A parameter shared by two modules is in the first bucket that holds it; the
    sharded ones (node embeddings) in none."""
    mods = list(model.convs) if hasattr(model, "convs") else list(model.children())
    seen, buckets = {id(p) for p in sharded_parameters(model).values()}, []
    for m in [*reversed(mods), model]:
        b = [p for p in m.parameters() if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in b)
        buckets.append(b)
    return [b for b in buckets if b]


class GradSync:
    def __init__(self, comm, buckets: list, watchdog=None, direct: bool = False):
        """``buckets``: lists of parameters, in the order backward completes them (last layer first), all on one
        device; ``direct``: hand MPI the device buffer (parameters on a GPU, a CUDA-aware MPI)."""
        self.comm, self.watchdog = comm, watchdog
        self.buckets = [list(b) for b in buckets if len(b)]
        sizes = [sum(p.numel() for p in b) for b in self.buckets]
        devices = {p.device for b in self.buckets for p in b}
        if len(devices) > 1:
            raise ValueError(f"the parameters are on several devices: {sorted(map(str, devices))}")
        self.device = devices.pop() if devices else torch.device("cpu")
        self.direct = bool(direct) and self.device.type == "cuda"
        if self.device.type != "cuda":
            self.buf = torch.zeros(sum(sizes), dtype=torch.float32)
        elif self.direct:
            self.buf = torch.zeros(sum(sizes), dtype=torch.float32, device=self.device)
        else:
            self.buf = torch.zeros(sum(sizes), dtype=torch.float32, pin_memory=True)
        self.segments, off = [], 0
        for n in sizes:
            self.segments.append(self.buf[off:off + n])
            off += n
        self._bucket_of = {}
        for i, b in enumerate(self.buckets):
            for p in b:
                if id(p) in self._bucket_of:
                    raise ValueError("a parameter appears in two buckets")
                self._bucket_of[id(p)] = i
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for b in self.buckets for p in b]
        self._active = False
        self.reqs: list = []

    def begin(self) -> None:
        """Arm the hooks for one backward pass."""
        self._pending = [len(b) for b in self.buckets]
        self.reqs = [MPI.REQUEST_NULL] * len(self.buckets)
        self._next = 0
        self._active = True
        self.started_during_backward = 0

    def _ready(self, p) -> None:
        if not self._active:
            return
        self._pending[self._bucket_of[id(p)]] -= 1
        while self._next < len(self.buckets) and self._pending[self._next] <= 0:
            self._start(self._next)
            self.started_during_backward += 1

    def _start(self, i: int) -> None:
        seg, off = self.segments[i], 0
        for p in self.buckets[i]:
            n = p.numel()
            if p.grad is None:
                seg[off:off + n].zero_()
            else:
                seg[off:off + n] = p.grad.reshape(-1)   # (on a GPU, staged: a device-to-host copy)
            off += n
        if self.direct:   # MPI reads the device buffer: what the stream has queued must be written first
            torch.cuda.current_stream(self.device).synchronize()
            self.reqs[i] = self.comm.Iallreduce(MPI.IN_PLACE, seg, op=MPI.SUM)
        else:
            self.reqs[i] = self.comm.Iallreduce(MPI.IN_PLACE, seg.numpy(), op=MPI.SUM)
        self._next = i + 1

    def flush(self) -> None:
        """Start every bucket backward did not (in order) and disarm the hooks."""
        while self._next < len(self.buckets):
            self._start(self._next)
        self._active = False

    def wait(self) -> None:
        """Wait for every bucket (with the watchdog's deadline when it is active)."""
        if self.watchdog is not None and self.watchdog.active:
            self.watchdog.wait_collective(self.reqs, "gradient allreduce")
        else:
            MPI.Request.Waitall(self.reqs)

    def unpack(self) -> None:
        for seg, b in zip(self.segments, self.buckets):
            off = 0
            for p in b:
                n = p.numel()
                if p.grad is None:
                    p.grad = seg[off:off + n].view_as(p).to(p.device, copy=True)
                else:
                    p.grad.copy_(seg[off:off + n].view_as(p))
                off += n

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._hooks = []
