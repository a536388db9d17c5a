"""data_tools.bench_partition end to end on Cora."""
from __future__ import annotations

import json


def test_bench_partition_small(cora_npz, tmp_path):
    """The benchmark end to end on Cora at 2 parts, and --merge of two result files."""
    from data_tools.bench_partition import main as bench_main
    out = tmp_path / "b.json"
    assert bench_main(["--graphs", "cora", "--parts", "2", "--repeats", "2", "--cora", str(cora_npz),
                       "--out", str(out)]) == 0
    r = json.loads(out.read_text())
    methods = {row["method"] for row in r["rows"]}
    assert {"metis-nodes", "metis-edges", "metis-both", "metis-edges-volume", "random", "g3", "g3-cut",
            "g3-volume"} <= methods
    assert all(row["seconds"] >= 0 and row["wall_seconds"] >= 0 for row in r["rows"])
    assert r["run"]["command"].startswith("python -m data_tools.bench_partition")
    assert [c["method"] for c in r["checks"]] == ["g3", "g3-cut", "g3-volume"]
    same = {row["method"]: row.get("same_as") for row in r["rows"]}
    assert same["g3-cut"] == "g3" and same["g3"] is None and same["g3-volume"] is None  # Cora: not skewed
    assert all(c["lowest_cost_incl_volume"] <= c["lowest_cost"] for c in r["checks"])
    sub = tmp_path / "s.json"
    assert bench_main(["--graphs", "cora", "--parts", "2", "--repeats", "1", "--cora", str(cora_npz),
                       "--methods", "metis-nodes,g3", "--out", str(sub)]) == 0
    assert {row["method"] for row in json.loads(sub.read_text())["rows"]} == {"metis-nodes", "g3"}
    merged = tmp_path / "m.json"
    assert bench_main(["--merge", str(out), str(out), "--out", str(merged)]) == 0
    m = json.loads(merged.read_text())
    assert len(m["rows"]) == 2 * len(r["rows"]) and m["cost_model"] == r["cost_model"]
