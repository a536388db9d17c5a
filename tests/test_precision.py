"""16-bit halo messages (``--halo-dtype``) and bf16-mixed precision (``--precision``): close to float32, half the
halo bytes, no float16 overflow; float32 unchanged."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from g3mpi.comm.codec import codec_for
from tests.conftest import run_mpi
from tests.graphs import partition, random_graph
from tests.pyg_reference import assert_variants_equal, rel_err

# more than 1 s each here: tests/conftest.py marks them slow (README: Tests)
SLOW_TESTS = ("test_halo_dtypes_close_to_float32", "test_bf16_mixed_close_to_fp32",
              "test_bf16_mixed_g3_train_with_kept_input_halo", "test_bf16_mixed_trainer_keeps_input_bfloat16")

MODELS = ("gcn", "sage", "gat")
BASE = "pipelined:0:0"


@pytest.mark.parametrize("name", ["bfloat16", "float16"])
@pytest.mark.parametrize("mag", [1e-12, 1.0, 1e5, 1e30])
def test_16bit_codec_keeps_range(name, mag):
    """float16 travels with a per-message scale: 1e30 does not overflow, 1e-12 does not flush to zero."""
    x = (np.random.default_rng(0).standard_normal((40, 9)) * mag).astype(np.float32)
    c = codec_for(name)
    wire = c.wire(x)
    c.encode(x, wire)
    y = np.full_like(x, np.nan)
    c.decode(wire, y)
    assert wire.nbytes == x.nbytes // 2 + (4 if name == "float16" else 0)
    assert np.isfinite(y).all()
    tol = 2 ** -8 if name == "bfloat16" else 2 ** -10
    assert np.abs(y - x).max() <= tol * np.abs(x).max()
    # a bfloat16 payload (bf16-mixed) encodes the same way
    c.encode(torch.from_numpy(x).bfloat16(), wire)
    c.decode(wire, y)
    assert np.abs(y - x).max() <= 2 * 2 ** -8 * np.abs(x).max()


def test_one_list_of_halo_dtypes():
    from g3mpi.comm.codec import HALO_DTYPES
    from g3mpi.train.config import HALO_DTYPES as CONFIG_HALO_DTYPES
    assert HALO_DTYPES == CONFIG_HALO_DTYPES


def test_float32_travels_as_is():
    assert codec_for("float32") is None
    with pytest.raises(ValueError, match="float8"):
        codec_for("float8")


@pytest.mark.parametrize("P", [2])
def test_halo_dtypes_close_to_float32(P, tmp_path):
    """GCN, SAGE and GAT with 16-bit halos (pipelined and blocking, whole and pieced messages) stay close to
    float32's logits and gradients (float16: 1e-2; bfloat16, 8 bits of mantissa: 1e-2 for logits, 0.1 for the
    gradients of the 8-wide test model, whose sums over rows cancel) and send half its layer bytes."""
    partition(random_graph(n=160, seed=P), P, tmp_path / "parts", seed=P)
    variants = ("pipelined:0:0:halobfloat16", "pipelined:0:0:halofloat16", "blocking:-1:0:halofloat16:piece64")
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((BASE,) + variants), timeout=600)
    res = np.load(tmp_path / "out.npz")
    assert_variants_equal(res, BASE, variants[1:], MODELS, 1e-2)
    assert_variants_equal(res, BASE, variants[:1], MODELS, 0.1)
    for model in MODELS:
        assert rel_err(res[f"{variants[0]}/{model}/logits"], res[f"{BASE}/{model}/logits"]) <= 1e-2
    for model in MODELS:
        full = int(res[f"{BASE}/{model}/bytes_sent"])
        for v in variants:
            assert 0.45 * full < int(res[f"{v}/{model}/bytes_sent"]) < 0.62 * full, (v, model)


@pytest.mark.parametrize("P", [1, 2])
def test_bf16_mixed_close_to_fp32(P, tmp_path):
    """bf16-mixed (bfloat16 products and activations; float32 weights, so float32 gradients), alone and with
    float16 halos, and with the recomputing path (``--remat cheap``, GAT by chunks of 64 edges), stays within
    2e-2 of fp32's logits and 0.2 of its gradients (bfloat16 activation gradients
    through three layers: measured up to 0.11) for GCN, SAGE and GAT; the gradients of the weights are float32."""
    partition(random_graph(n=160, seed=P + 3), P, tmp_path / "parts", seed=P)
    variants = ("pipelined:0:0:bf16", "blocking:-1:0:bf16", "pipelined:0:0:bf16:remat64") + (
        ("pipelined:0:0:bf16:halofloat16",) if P > 1 else ())
    run_mpi(P, "tests.mpi_exact", tmp_path / "parts", tmp_path / "out.npz", "--models", ",".join(MODELS),
            "--variants", ",".join((BASE,) + variants), "--hidden", "32", timeout=600)
    res = np.load(tmp_path / "out.npz")
    assert_variants_equal(res, BASE, variants, MODELS, 0.2)
    for model in MODELS:
        for v in variants:
            assert rel_err(res[f"{v}/{model}/logits"], res[f"{BASE}/{model}/logits"]) <= 2e-2, (v, model)
        for k in res.files:
            if k.startswith(f"{variants[0]}/{model}/grad/"):
                assert res[k].dtype == np.float32
        assert not np.array_equal(res[f"{variants[0]}/{model}/logits"], res[f"{BASE}/{model}/logits"])


def test_bf16_mixed_trainer_keeps_input_bfloat16(tmp_path):
    """bf16-mixed stores a built-in model's input in bfloat16 (the first product rounds it so anyway) and drops
    the part's float32 copy; fp32 keeps the float32 features."""
    from mpi4py import MPI

    from g3mpi.format import read_meta, read_part
    from g3mpi.mpi.watchdog import Watchdog
    from g3mpi.train.config import TrainConfig
    from g3mpi.train.startup import start_up_sums
    from g3mpi.train.trainer import Trainer
    partition(random_graph(n=160, seed=7), 1, tmp_path / "parts", seed=1)
    meta = read_meta(tmp_path / "parts")
    for precision, dtype in (("fp32", torch.float32), ("bf16-mixed", torch.bfloat16)):
        part = read_part(tmp_path / "parts", 0, meta)
        sums, _ = start_up_sums(part, Watchdog(MPI.COMM_SELF, 0))
        cfg = TrainConfig(parts=str(tmp_path / "parts"), out="", model="gcn", hidden=16, precision=precision,
                          progress=False, epochs=2, timeline_epoch=0, verify=False)
        tr = Trainer(cfg, MPI.COMM_SELF, part, meta, sums)
        assert tr.x.dtype == dtype
        assert (part.features is None) == (dtype == torch.bfloat16)
        tr.train_step(1)
        tr.ctx.free()


@pytest.mark.parametrize("P", [2])
def test_bf16_mixed_g3_train_with_kept_input_halo(P, tmp_path):
    """g3-train --precision bf16-mixed on two ranks with dropout: layer 0 aggregates the kept input halo rows as
    bfloat16 beside the bfloat16 owned rows, and the run ends with a finite loss."""
    partition(random_graph(n=160, seed=P), P, tmp_path / "parts", seed=P)
    run_mpi(P, "g3mpi.cli.train", "--parts", tmp_path / "parts", "--out", tmp_path / "run", "--model", "gcn",
            "--hidden", "16", "--epochs", "3", "--dropout", "0.5", "--precision", "bf16-mixed", "--no-plots",
            "--no-progress", timeout=300)
    import json
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert np.isfinite(s["test_acc"]), s
