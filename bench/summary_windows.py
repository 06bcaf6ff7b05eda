"""CPU of one heartbeat summary (``Node.summary(with_windows=True)``) with N live subjobs
(``sleep 60``, 100 milli-GPU each, ``expected_seconds`` declared) on one in-process Node
with the fake backend. Numbers are reported, never asserted.

    .venv/bin/python bench/summary_windows.py [N]      # default 64
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from laminar_agent.inventory.fake import FakeGpuBackend  # noqa: E402
from laminar_agent.node import Node  # noqa: E402
from laminar_api.v1 import agent_pb2, common_pb2  # noqa: E402

N = int(sys.argv[1]) if len(sys.argv) > 1 else 64


async def main() -> None:
    node = Node("a", FakeGpuBackend("8xH100-80GB:shared", agent_id="a"), Path(tempfile.mkdtemp()))
    try:
        for i in range(N):
            g = await node.probe(
                agent_pb2.ProbeRequest(
                    probe_id=f"p{i}",
                    job_id=f"j{i}",
                    resources=common_pb2.Resources(gpu_milli=100),
                    lease_ttl_seconds=30,
                )
            )
            spec = common_pb2.SubjobSpec(
                job_id=f"j{i}",
                subjob_id=f"s{i}",
                command=["sleep", "60"],
                expected_seconds=100,
                env={f"K{k}": "v" * 50 for k in range(20)},
            )
            await node.commit(g.lease.lease_id, spec)
        for _rep in range(3):
            t = time.process_time()
            for _ in range(200):
                node.summary(with_windows=True)
            print(
                f"N={N}: {(time.process_time() - t) / 200 * 1000:.3f} ms per summary with windows"
            )
        for i in range(N):
            node.executor.kill(f"s{i}")
        for i in range(N):
            await node.executor.wait(f"s{i}")
    finally:
        await node.close()


if __name__ == "__main__":
    asyncio.run(main())
