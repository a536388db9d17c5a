"""One flipped byte inside an array of a stored (np.savez, uncompressed) .npz, for every g3-prepare route that reads
an archive: refused with one line naming the archive and the member, non-zero exit, nothing written. Deflated
members fail in zlib anyway; a stored member has only its zip CRC-32 to tell (np.load checks it when it reads a
member to its end; the OGB binary reader, which reads in blocks, combines the blocks' CRCs)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.prepare_runs import cora_like, fails, out_dir  # noqa: F401 (out_dir: a fixture)
from tests.test_prepare_ogb_binary import arrays, flip_in_member, make_binary

SLOW_TESTS = ("test_npz_flipped_byte_refused", "test_edgelist_masks_flipped_byte_refused",
              "test_ogb_binary_flipped_byte_refused")


@pytest.mark.parametrize("member", ["edge_index", "x", "y", "test_mask"])
def test_npz_flipped_byte_refused(tmp_path, out_dir, member):
    f = cora_like(tmp_path / "g.npz")
    flip_in_member(f, member, at=0)      # still a valid value: only the CRC can tell
    fails(out_dir, "npz", f, path=f, words=[f"'{member}", "CRC-32"])


def test_edgelist_masks_flipped_byte_refused(tmp_path, out_dir):
    f = tmp_path / "e.txt"
    f.write_text("0 1\n1 2\n")
    y = tmp_path / "y.npy"
    np.save(y, np.array([0, 1, 1]))
    m = tmp_path / "m.npz"
    np.savez(m, train_mask=np.array([1, 0, 0], bool), val_mask=np.array([0, 1, 0], bool),
             test_mask=np.array([0, 0, 1], bool))
    flip_in_member(m, "val_mask", at=0)   # True -> 0x00: a valid bool
    fails(out_dir, "edgelist", f, "--labels", y, "--masks", m, path=m, words=["'val_mask", "CRC-32"])


@pytest.mark.parametrize("archive,member", [("data.npz", "edge_index"), ("data.npz", "node_feat"),
                                            ("node-label.npz", "node_label")])
def test_ogb_binary_flipped_byte_refused(tmp_path, out_dir, archive, member):
    e, x, y, split = arrays()
    root = make_binary(tmp_path / "s", e, x, y, split, compressed=False)
    flip_in_member(root / "raw" / archive, member, at=0)
    fails(out_dir, "ogb", root, path=root / "raw" / archive, words=[f"'{member}'", "CRC-32"])
