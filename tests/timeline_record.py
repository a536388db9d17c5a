"""What a recorded timeline (g3mpi.comm.timeline.combine) must satisfy, for the tests of g3-train and g3-bench."""
from __future__ import annotations

import pytest

from g3mpi.comm.timeline import BLOCKED, KINDS, PHASES


def check_record(doc: dict, P: int, layers: int, model: str, first_sends: bool = True):
    """Every rank's events are well formed, lie in the recorded epoch, and cover each layer's exchange: forward
    for every layer, backward for every layer but the first (no gradient flows back to the input features).
    ``first_sends`` False: the first layer sends nothing (the model keeps its input's halo: the input cache)."""
    assert len(doc["ranks"]) == P and doc["model"] == model
    sent, landed = {}, {}
    for r in doc["ranks"]:
        rank, ev = r["rank"], r["events"]
        marks = [e for e in ev if e[0] == "phase"]
        assert [e[1] for e in marks] == list(PHASES)
        assert [e[2] for e in marks] == sorted(e[2] for e in marks)
        start, end = marks[0][2], marks[-1][2]
        for kind, name, t0, t1, peer in ev:
            assert kind in KINDS + ("phase",), kind
            assert start <= t0 <= t1 <= end, (kind, name, t0, t1)
            assert t1 == t0 or kind in BLOCKED
            if kind in ("send", "land"):
                assert 0 <= peer < P and peer != rank
                (sent if kind == "send" else landed).setdefault(name, []).append(
                    (rank, peer) if kind == "send" else (peer, rank))
        rounds = {n for k, n, *_ in ev if k == "post"}
        first = 0 if first_sends else 1
        want = {f"{model}{i}.fwd" for i in range(first, layers)} | {f"{model}{i}.bwd" for i in range(1, layers)}
        assert want <= rounds and (first_sends or f"{model}0.fwd" not in rounds), (rank, sorted(rounds))
        segs = r["segments"]
        assert all(a < b for _, a, b in segs) and all(b <= a for (_, _, b), (_, a, _) in zip(segs, segs[1:]))
        for _, a, b in segs:
            assert not any(w0 < b and a < w1 for k, _, w0, w1, _ in ev if k in BLOCKED and w1 > w0)
        labels = {lb for lb, _, _ in segs}
        assert {f"{model}{i} fwd" for i in range(first, layers)} | {f"{model}{i} bwd" for i in range(1, layers)} \
            <= labels
        s = r["summary"]
        assert s["epoch_s"] == pytest.approx(end - start)
        assert sum(s["compute_s"].values()) + s["blocked_total_s"] == pytest.approx(s["epoch_s"], rel=1e-6, abs=1e-9)
    # every message one rank sent in the recorded epoch landed at its peer, and nothing else landed
    assert {n: sorted(v) for n, v in sent.items()} == {n: sorted(v) for n, v in landed.items()}
