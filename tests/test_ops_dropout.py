"""Dropout masks depend only on (seed, epoch, layer, original node ID): identical for any partition."""
from __future__ import annotations

import torch

from g3mpi.ops import DropoutKey, edge_keep_mask, keep_mask, node_dropout


def test_mask_is_keyed_by_node_id_not_position():
    k = DropoutKey(seed=3, epoch=5)
    ids = torch.arange(1000)
    full = keep_mask(k, 1, 0, ids, 37, 0.5)
    perm = torch.randperm(1000)
    assert torch.equal(keep_mask(k, 1, 0, ids[perm], 37, 0.5), full[perm])
    assert torch.equal(keep_mask(k, 1, 0, ids[100:110], 37, 0.5), full[100:110])


def test_mask_statistics_and_scaling():
    k = DropoutKey(seed=0, epoch=1)
    m = keep_mask(k, 0, 0, torch.arange(20000), 64, 0.3)
    kept = (m > 0).float()
    assert abs(kept.mean().item() - 0.7) < 0.01
    assert torch.allclose(m[m > 0], torch.tensor(1 / 0.7))
    assert (kept.mean(0) - 0.7).abs().max() < 0.03       # no column bias
    other = keep_mask(DropoutKey(seed=0, epoch=2), 0, 0, torch.arange(20000), 64, 0.3) > 0
    assert 0.5 < ((m > 0) == other).float().mean() < 0.7  # epochs differ (agreement ~ 0.7^2 + 0.3^2)
    layer = keep_mask(k, 1, 0, torch.arange(20000), 64, 0.3) > 0
    assert 0.5 < ((m > 0) == layer).float().mean() < 0.7


def test_edge_mask_and_eval_mode():
    k = DropoutKey(seed=1, epoch=0)
    dst, src = torch.tensor([5, 5, 7]), torch.tensor([7, 9, 5])
    m = edge_keep_mask(k, 0, dst, src, 4, 0.6)
    assert m.shape == (3, 4)
    assert torch.equal(edge_keep_mask(k, 0, dst[[2, 0]], src[[2, 0]], 4, 0.6), m[[2, 0]])
    x = torch.randn(4, 3)
    assert node_dropout(x, k, 0, torch.arange(4), 0.5, training=False) is x


def test_a_column_range_drops_as_those_columns_of_the_whole():
    """``node_dropout`` of columns ``first ..`` (a multiple of 4) equals those columns of the whole input's, bit for
    bit (GCN makes its dropped input a column block at a time); other starts are refused."""
    import pytest
    key = DropoutKey(seed=3, epoch=2)
    ids = torch.arange(5, 5 + 300) * 7
    x = torch.randn(300, 19)
    whole = node_dropout(x, key, 0, ids, 0.5, True)
    for a, b in ((0, 8), (8, 16), (16, 19), (4, 7)):
        part = node_dropout(x[:, a:b], key, 0, ids, 0.5, True, first=a)
        assert torch.equal(part, whole[:, a:b]), (a, b)
    with pytest.raises(ValueError, match="multiple of 4"):
        node_dropout(x[:, 3:8], key, 0, ids, 0.5, True, first=3)
