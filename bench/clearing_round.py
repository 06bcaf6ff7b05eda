"""Benchmark one atomization clearing round at zone scale: bids plus clearing, pure code.

A zone of A agents advertises W windows each (a mix of MIG profiles and whole GPUs, the
router's 600 s cap or shorter ends before a blocked job); J atomized jobs wait. The
round the router runs (``market.round_bids``: alike windows priced once per bidder, then
``market.clear``) is timed next to the same round priced window by window (``best_bid``
on every window), in the same invocation, and the awards are checked to be the same.
Numbers are reported as a ratio to that baseline, never asserted.

    .venv/bin/python bench/clearing_round.py [--agents 300] [--windows 16] [--jobs 200] [-o json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable

from laminar_zone.market import (
    Award,
    Bid,
    Bidder,
    MarketWindow,
    best_bid,
    clear,
    contract_from,
    round_bids,
)

GIB = 1 << 30
#: (tag, memory) of the slices a window can be on.
SLICES = (("mig:1g.10gb", 10), ("mig:2g.20gb", 20), ("mig:3g.40gb", 40), ("gpu:H100", 80))


def zone(
    agents: int, per_agent: int, jobs: int, seed: int
) -> tuple[list[MarketWindow], list[Bidder]]:
    rng = random.Random(seed)
    windows = []
    for a in range(agents):
        for i in range(per_agent):
            tag, gib = rng.choice(SLICES)
            length = 600.0 if rng.random() < 0.8 else float(rng.choice((120, 300)))
            windows.append(MarketWindow(f"h{a:05d}", f"s{i}", gib * GIB, 1000, length, tag))
    bidders = []
    for j in range(jobs):
        per_unit = rng.uniform(1.0, 30.0)
        memory = rng.uniform(5, 60) * GIB
        c = contract_from(
            total_units=rng.randint(50, 5000),
            seconds_per_unit=[(0.5, per_unit), (0.95, per_unit * 1.3)],
            peak_memory_bytes=[(0.5, memory * 0.8), (0.95, memory)],
            checkpoint_overhead_seconds=10.0,
        )
        bidders.append(
            Bidder(
                f"j{j:05d}", f"t{j % 7}", c, c.profile, 0, rng.uniform(0, 900), rng.randint(1, 4)
            )
        )
    return windows, bidders


def per_window(bidders: list[Bidder], windows: list[MarketWindow]) -> list[Bid]:
    out = []
    for b in bidders:
        for w in windows:
            bid = best_bid(
                b.job_id,
                b.tenant,
                b.contract,
                b.profile,
                w,
                b.next_unit,
                b.waited_seconds,
                b.priority,
            )
            if bid is not None:
                out.append(bid)
    return out


def timed(fn: Callable[[], list[Award]], repeats: int) -> tuple[float, list[Award]]:
    samples, result = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples), result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=300)
    parser.add_argument("--windows", type=int, default=16, help="windows per agent")
    parser.add_argument("--jobs", type=int, default=200, help="waiting atomized jobs")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    args = parser.parse_args(argv)
    windows, bidders = zone(args.agents, args.windows, args.jobs, args.seed)
    grouped_s, grouped = timed(lambda: clear(round_bids(bidders, windows), "blend"), args.repeats)
    naive_s, naive = timed(lambda: clear(per_window(bidders, windows), "blend"), 1)
    same = [(a.bid.job_id, a.bid.window.key) for a in grouped] == [
        (a.bid.job_id, a.bid.window.key) for a in naive
    ]
    report = {
        "agents": args.agents,
        "windows": len(windows),
        "jobs": len(bidders),
        "awards": len(grouped),
        "round_seconds": round(grouped_s, 4),
        "baseline_per_window_seconds": round(naive_s, 4),
        "speedup_vs_baseline": round(naive_s / grouped_s, 1) if grouped_s else None,
        "same_awards": same,
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {platform.processor() or 'cpu'}",
    }
    if args.output == "json":
        print(json.dumps(report, indent=2))
    else:
        print(
            f"clearing round, {report['windows']} windows on {args.agents} agents, "
            f"{report['jobs']} waiting jobs: {grouped_s * 1000:.1f} ms "
            f"({report['awards']} awards; priced per window: {naive_s * 1000:.0f} ms, "
            f"{report['speedup_vs_baseline']}x; same awards: {same})"
        )
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
