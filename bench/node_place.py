"""The agent's own CPU per placement, without gRPC: one in-process ``Node`` (8 shared H100s,
``--held`` leases kept all along) takes a probe, releases its lease and builds the summary a
Release reply carries, N times; the probe's reply carries one too. What the gRPC bench
adds (the calls themselves, the loop under load) is not here. Reports the lowest of
``--rounds`` rounds (this machine is shared and noisy), and the summary's parts on their
own. Numbers are reported, never asserted.

    .venv/bin/python bench/node_place.py [--placements 3000] [--held 40] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a tree put first on PYTHONPATH wins
    sys.path.append(str(ROOT))

from _report import emit  # noqa: E402  (bench/, the script's own folder)

from laminar_agent.inventory.fake import FakeGpuBackend  # noqa: E402
from laminar_agent.node import Node  # noqa: E402
from laminar_api.v1 import agent_pb2, common_pb2  # noqa: E402


async def measure(placements: int, held: int, rounds: int) -> dict[str, float]:
    node = Node(
        "a",
        FakeGpuBackend("8xH100-80GB:shared", agent_id="a"),
        Path(tempfile.mkdtemp(prefix="node-place-")),
        batch_seconds=0.0,
    )
    share = common_pb2.Resources(gpu_milli=100)

    def probe(probe_id: str) -> agent_pb2.ProbeRequest:
        return agent_pb2.ProbeRequest(
            probe_id=probe_id, job_id=probe_id, resources=share, lease_ttl_seconds=60
        )

    try:
        for i in range(held):
            if not (await node.probe(probe(f"h{i}"))).HasField("lease"):
                raise SystemExit(f"--held {held}: only {i} leases of 100 milli-GPU fit")
        per_placement, per_summary = [], []
        for r in range(rounds):
            t = time.process_time()
            for i in range(placements):
                reply = await node.probe(probe(f"p{r}-{i}"))
                assert reply.HasField("lease"), reply.bounce.reason
                node.release([reply.lease.lease_id])
                node.summary()
            per_placement.append((time.process_time() - t) / placements)
            t = time.process_time()
            for _ in range(placements):
                node.summary()
            per_summary.append((time.process_time() - t) / placements)
        return {
            "placements": placements,
            "held_leases": held,
            "rounds": rounds,
            "cpu_us_per_placement": round(min(per_placement) * 1e6, 1),
            "cpu_us_per_summary_unchanged_ledger": round(min(per_summary) * 1e6, 1),
        }
    finally:
        await node.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--placements", type=int, default=3000)
    ap.add_argument("--held", type=int, default=40, help="leases held throughout (< 80)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = ap.parse_args()
    result = asyncio.run(measure(args.placements, args.held, args.rounds))
    emit(result, args.output)


if __name__ == "__main__":
    main()
