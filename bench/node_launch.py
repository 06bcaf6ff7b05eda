"""The agent's own CPU per launched job, without gRPC: one in-process ``Node`` (fake GPUs,
cgroups as the agent opens them) takes N commit-carrying probes of ``true``, C at a time,
each waited until its end is recorded; every 8 ends a heartbeat's request is built
(:meth:`HeartbeatClient._request`: summary with windows, the events' messages) and its
events acknowledged, as the router's reply would. Reports this process's CPU per job and
what does not depend on the machine's load: journal commits and subjob row reads per job,
and read and write system calls per job (``/proc/self/io``: the launcher's pipe, SQLite's
WAL, ``/proc`` and cgroup files). Numbers are reported, never asserted.

    .venv/bin/python bench/node_launch.py [--launches 300] [--concurrency 4] [-o json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # a tree put first on PYTHONPATH wins
    sys.path.append(str(ROOT))

from _report import emit  # noqa: E402  (bench/, the script's own folder)

from laminar_agent.cgroups import open_cgroups  # noqa: E402
from laminar_agent.heartbeat import HeartbeatClient  # noqa: E402
from laminar_agent.inventory.fake import FakeGpuBackend  # noqa: E402
from laminar_agent.journal import Journal  # noqa: E402
from laminar_agent.node import Node  # noqa: E402
from laminar_api.v1 import agent_pb2, common_pb2  # noqa: E402

HEARTBEAT_EVERY_ENDS = 8


def _io_calls() -> tuple[int, int]:
    """Read and write system calls of this process so far (``syscr``, ``syscw``)."""
    fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
    return int(fields["syscr"]), int(fields["syscw"])


class _Counted:
    """Counts calls of chosen Journal methods (wrapped on the class for the run)."""

    def __init__(self, names: list[str]) -> None:
        self.counts = dict.fromkeys(names, 0)
        self._originals = {name: getattr(Journal, name) for name in names}
        for name, original in self._originals.items():
            setattr(Journal, name, self._wrap(name, original))

    def _wrap(self, name: str, original: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] += 1
            return original(*args, **kwargs)

        return counted

    def reset(self) -> None:
        self.counts = dict.fromkeys(self.counts, 0)


async def measure(launches: int, concurrency: int) -> dict[str, object]:
    counted = _Counted(["_commit", "get_subjob", "has_subjob"])
    root = Path(tempfile.mkdtemp(prefix="laminar-node-launch-bench-"))
    cgroups = open_cgroups("auto", f"node-launch-bench-{os.getpid()}")
    node = Node(
        "bench",
        FakeGpuBackend("8xH100-80GB:shared", agent_id="bench"),
        root / "state",
        cgroups=cgroups,
        host_totals=(1_000_000, 1 << 40),
    )
    client = HeartbeatClient(
        "unused:0",
        1.0,
        lambda: node.summary(with_windows=True),
        node.journal,
        node.reads.event_message,
    )
    ended = asyncio.Event()
    ends = 0
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        nonlocal ends
        async with gate:
            reply = await node.probe(
                agent_pb2.ProbeRequest(
                    probe_id=f"p{index}",
                    job_id=f"j{index}",
                    resources=common_pb2.Resources(gpu_milli=100),
                    commit_if_fits=True,
                    spec=common_pb2.SubjobSpec(
                        job_id=f"j{index}", subjob_id=f"s{index}", command=["true"]
                    ),
                )
            )
            assert reply.subjob.state == common_pb2.RUNNING, reply
            while node.core.subjob(f"s{index}") is not None:
                ended.clear()
                await ended.wait()
            ends += 1
            if ends % HEARTBEAT_EVERY_ENDS == 0:
                request, _ = client._request()
                if request.events:
                    node.journal.ack_events(max(e.seq for e in request.events))

    node.add_event_waiter(ended)
    await one(-1)  # starts the launcher
    counted.reset()
    io_before = _io_calls()
    own_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(launches)))
    elapsed = time.perf_counter() - started
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    io_after = _io_calls()
    states = [e.state for e in node.journal.events_after(0, 10 * launches)]
    await node.close()
    if cgroups is not None and cgroups.base.exists():  # the close removes it once empty
        for path in cgroups.base.iterdir():
            if path.is_dir():
                path.rmdir()
        cgroups.base.rmdir()
    own = own_after.ru_utime + own_after.ru_stime - own_before.ru_utime - own_before.ru_stime
    return {
        "launches": launches,
        "concurrency": concurrency,
        "cgroups": cgroups is not None,
        "agent_cpu_ms_per_launch": round(1000 * own / launches, 3),
        "journal_commits_per_launch": round(counted.counts["_commit"] / launches, 2),
        "subjob_row_reads_per_launch": round(counted.counts["get_subjob"] / launches, 2),
        "read_syscalls_per_launch": round((io_after[0] - io_before[0]) / launches, 1),
        "write_syscalls_per_launch": round((io_after[1] - io_before[1]) / launches, 1),
        "launches_per_second": round(launches / elapsed, 1),
        "succeeded": states.count("SUCCEEDED") - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    args = parser.parse_args()
    result = asyncio.run(measure(args.launches, args.concurrency))
    emit(result, args.output)


if __name__ == "__main__":
    main()
