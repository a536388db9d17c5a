"""``--precision``: fp32 (exact, the default) or bf16-mixed.

bf16-mixed runs the model's forward under ``torch.autocast("cpu", bfloat16)``: dense products (Linear, matmul)
run in bfloat16 and their outputs, which autograd stores for backward, are bfloat16; the weights, their gradients,
the optimiser state and the gradient allreduce stay float32 (autocast casts the float32 weights per product, and
backward returns float32 gradients for them). A built-in model's input features are kept in bfloat16 (the first
product would round them so; a kept input halo too), so layer 0's aggregate of them is bfloat16 as well. The sparse aggregations take bfloat16 rows as they come
(``g3mpi.ops.blocks.spmm``: a bfloat16 gather with float32 accumulation per row); GAT's attention terms come from
one bfloat16 product, its weighted sums take bfloat16 rows, and its scores and softmax are float32 per-edge arrays
(``g3mpi.ops.gat``); the logits are cast to float32 before the loss and the metrics. Any model built
from torch modules (built-in, recipe, user) runs so without change.
"""
from __future__ import annotations

import contextlib
import functools
import logging

import torch

log = logging.getLogger("g3mpi")

@functools.cache
def bf16_native() -> bool:
    """Whether this CPU has bfloat16 instructions (AVX512-BF16 or AMX-BF16): without them torch emulates the
    products, slower than float32."""
    try:
        if torch.ops.mkldnn._is_mkldnn_bf16_supported():
            flags = _cpu_flags()
            return flags is None or bool({"avx512_bf16", "amx_bf16"} & flags)
    except (AttributeError, RuntimeError):
        pass
    return False


def _cpu_flags() -> set | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        return None
    return None


def autocast(precision: str, device: str = "cpu"):
    """The context the forward runs in: nothing for fp32; bfloat16 autocast for bf16-mixed."""
    if precision == "fp32":
        return contextlib.nullcontext()
    if precision != "bf16-mixed":
        raise ValueError(f"precision {precision!r}: expected fp32 or bf16-mixed")
    return torch.autocast(device, dtype=torch.bfloat16)


@functools.cache
def warn_if_slow(precision: str, rank: int = 0) -> None:
    """Say once (rank 0) when bf16-mixed would run slower than fp32 on this CPU."""
    if precision == "bf16-mixed" and rank == 0 and not bf16_native():
        log.warning("precision bf16-mixed: this CPU (%s) has no bfloat16 instructions (AVX512-BF16 / AMX): torch "
                    "emulates them and epochs will likely be slower than with fp32",
                    torch.backends.cpu.get_cpu_capability())
