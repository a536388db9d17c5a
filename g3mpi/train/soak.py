"""Memory soak check of a finished run: RSS growth per rank after warm-up, from ``RUN/metrics.jsonl``.

    python -m g3mpi.train.soak RUN [--warmup 50] [--max-growth 0.02]

``g3-train`` records every rank's resident set size at the end of every epoch (``rank_rss_bytes``). RSS
oscillates by a few MiB from epoch to epoch (the allocator returns and takes pages, evaluation epochs allocate
more), so one sample is no baseline. After ``warmup`` epochs (allocator pools, caches, the first checkpoint) the
growth of a rank is ``median(RSS of the last W epochs) / median(RSS of the first W epochs after warm-up) - 1``
with ``W = --window`` (a leak shows as a trend between the two windows); the peak after warm-up relative to the
first window is printed beside it. Prints a table and a JSON summary; exits 1 when a rank grew more than
``max-growth``. ``jobs/soak.sh`` runs the whole soak (generate, partition, train).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from g3mpi.options import Parser

from .rundir import read_metrics

PROG = "g3-soak"


def rss_growth(records: list, warmup: int, window: int = 50) -> dict:
    """Per-rank RSS figures of metrics records (one per epoch, with ``rank_rss_bytes``)."""
    recs = [r for r in records if "rank_rss_bytes" in r]
    if not recs:
        raise ValueError("no epoch carries rank_rss_bytes (a run of an older g3-train?)")
    after = [r for r in recs if r["epoch"] > warmup]
    if len(after) < 2 * window:
        raise ValueError(f"need at least {2 * window} epochs after the warm-up ({warmup}); the run has "
                         f"{len(after)} after it")
    ranks = len(recs[0]["rank_rss_bytes"])
    out = []
    for k in range(ranks):
        series = [r["rank_rss_bytes"][k] for r in after]
        first, last = statistics.median(series[:window]), statistics.median(series[-window:])
        out.append(dict(rank=k, epoch1=recs[0]["rank_rss_bytes"][k], first_window=first, last_window=last,
                        min_after=min(series), max_after=max(series), growth=last / first - 1.0,
                        peak=max(series) / first - 1.0))
    return dict(epochs=recs[-1]["epoch"], warmup=warmup, window=window, ranks=out,
                max_growth=max(r["growth"] for r in out), max_peak=max(r["peak"] for r in out))


def main(argv=None) -> int:
    ap = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("run", type=Path, help="run directory (metrics.jsonl)")
    ap.add_argument("--warmup", type=int, default=50, help="epochs of warm-up (default 50)")
    ap.add_argument("--window", type=int, default=50, help="epochs per median window (default 50)")
    ap.add_argument("--max-growth", type=float, default=0.02, help="allowed growth after warm-up (default 0.02)")
    args = ap.parse_args(argv)
    path = args.run / "metrics.jsonl"
    try:
        res = rss_growth(read_metrics(path), args.warmup, args.window)
    except (OSError, ValueError) as e:
        print(f"{PROG}: error: {path}: {e}", file=sys.stderr)
        return 2
    mib = 1 / 2**20
    w = args.window
    print(f"{'rank':>4} {'epoch 1':>9} {'first ' + str(w):>9} {'last ' + str(w):>9} {'min':>9} {'max':>9} "
          f"{'growth':>8} {'peak':>7}   (MiB; window medians after epoch {args.warmup})")
    for r in res["ranks"]:
        print(f"{r['rank']:>4} {r['epoch1'] * mib:>9.1f} {r['first_window'] * mib:>9.1f} "
              f"{r['last_window'] * mib:>9.1f} {r['min_after'] * mib:>9.1f} {r['max_after'] * mib:>9.1f} "
              f"{100 * r['growth']:>7.2f}% {100 * r['peak']:>6.2f}%")
    print(json.dumps(res))
    ok = res["max_growth"] <= args.max_growth
    print(f"{PROG}: {'PASS' if ok else 'FAIL'}: RSS growth after epoch {args.warmup} (median of the last {w} "
          f"epochs vs the first {w}) is at most {100 * res['max_growth']:.2f}% over {res['epochs']} epochs "
          f"(limit {100 * args.max_growth:.1f}%); peak {100 * res['max_peak']:.2f}% above the first window")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
