"""The layout of a g3-train checkpoint (g3mpi.train.checkpoint.load_checkpoint): what loads, what is refused."""
from __future__ import annotations

import pytest
import torch

from g3mpi.train.checkpoint import CheckpointError, load_checkpoint


def _checkpoint(**changes) -> dict:
    model = {"w": torch.zeros(2)}
    c = dict(format="g3mpi-checkpoint", version=1, epoch=3, model=model, optimizer={"state": {}, "param_groups": []},
             rng=torch.get_rng_state(), best=dict(val_acc=0.5, epoch=2, accs={}, state=None), since_best=1,
             last_loss=0.7, config=dict(model="gcn"),
             partition=dict(partition_id="x", num_parts=2, method="metis", files={}))
    c.update(changes)
    return c


def test_checkpoint_good_layout_loads(tmp_path):
    torch.save(_checkpoint(), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["epoch"] == 3
    # the accuracies as make_checkpoint writes them (NaN: a split without nodes)
    accs = dict(train_acc=1.0, val_acc=0.5, test_acc=float("nan"))
    torch.save(_checkpoint(best=dict(val_acc=0.5, epoch=2, accs=accs, state=None)), tmp_path / "c.pt")
    assert load_checkpoint(tmp_path / "c.pt")["best"]["accs"]["val_acc"] == 0.5


@pytest.mark.parametrize("changes,what", [
    (dict(partition={}), "partition must hold"),
    (dict(config="oops"), "config must be a dict"),
    (dict(epoch="3"), "epoch must be a non-negative integer"),
    (dict(model={"w": 1.0}), "model must map parameter names to tensors"),
    (dict(best=dict(val_acc="x")), "best must hold"),
    (dict(rng=torch.zeros(3)), "rng must be a uint8 tensor"),
    # found by fuzzing checkpoints: 'preparing the run directory failed: TypeError: unsupported operand type(s)
    # for %: 'int' and 'list'', naming the run directory, not the checkpoint
    (dict(config=dict(model="gcn", eval_every=[16])), "config's eval_every must be a positive integer"),
    (dict(config=dict(model="gcn", eval_every=0)), "config's eval_every must be a positive integer"),
    # left open by the fuzzing campaign: accuracies of another type resumed, then the next checkpoint failed to
    # write ('could not convert string to float') or summary.json reported them as they were
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": "0.9"}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": [0.9]}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"val_acc": True}, state=None)), "best's accs must map"),
    (dict(best=dict(val_acc=0.5, epoch=2, accs={"loss": 0.9}, state=None)), "best's accs must map"),
])
def test_checkpoint_layout(tmp_path, changes, what):
    """Files that torch.load(weights_only=True) reads but that would crash the resume with a bare traceback."""
    torch.save(_checkpoint(**changes), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="c.pt: malformed checkpoint: " + what):
        load_checkpoint(tmp_path / "c.pt")


@pytest.mark.parametrize("value", [True, 1.0, "1"])
def test_checkpoint_version_not_an_integer(tmp_path, value):
    torch.save(_checkpoint(version=value), tmp_path / "c.pt")
    with pytest.raises(CheckpointError, match="c.pt: checkpoint version .* is not supported"):
        load_checkpoint(tmp_path / "c.pt")
