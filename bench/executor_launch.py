"""CPU per launch of the agent's Executor alone: N launches of ``true`` through the
pre-forked launcher (cgroups as the agent opens them, ``executor.cgroup_root = auto``),
C at a time, in this process (no gRPC, no journal). Reports this process's CPU per launch
(the agent's side: the launch record, the pipe, watching the pidfd, reading exit.json),
the launcher's with its reaped children (the commands; before issue 15's one-loop
launcher, supervisors and commands) and their page faults, the launcher's own, and the
rate. Numbers are reported, never asserted.

    .venv/bin/python bench/executor_launch.py [--launches 300] [--concurrency 4] [-o json]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]

from _report import emit  # noqa: E402  (bench/, the script's own folder)

from laminar_agent.cgroups import SubjobCgroups, open_cgroups  # noqa: E402
from laminar_agent.executor import Executor, ExitInfo, LaunchSpec  # noqa: E402


def _cpu_and_faults(pid: int) -> tuple[float, int, float]:
    """CPU seconds of ``pid`` with its reaped children, their minor page faults, and the
    CPU seconds of ``pid`` alone."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    # After the command name: minflt 7, cminflt 8, utime..cstime 11-14 (0-based).
    return (
        sum(int(x) for x in fields[11:15]) / ticks,
        int(fields[7]) + int(fields[8]),
        sum(int(x) for x in fields[11:13]) / ticks,
    )


def _remove(cgroups: SubjobCgroups | None) -> None:
    """What the executor's close left (its folder goes with it once empty)."""
    if cgroups is None or not cgroups.base.exists():
        return
    for path in cgroups.base.iterdir():
        if path.is_dir():
            path.rmdir()
    cgroups.base.rmdir()


async def measure(launches: int, concurrency: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="laminar-launch-bench-"))
    ended: dict[str, asyncio.Event] = {}
    codes: dict[str, int | None] = {}

    def on_exit(subjob_id: str, info: ExitInfo) -> None:
        codes[subjob_id] = info.exit_code
        ended[subjob_id].set()

    cgroups = open_cgroups("auto", f"launch-bench-{os.getpid()}")
    executor = Executor(
        root / "state", on_exit=on_exit, cgroups=cgroups, base_env={"PATH": os.environ["PATH"]}
    )
    gate = asyncio.Semaphore(concurrency)

    async def one(index: int) -> None:
        subjob_id = f"s{index}"
        ended[subjob_id] = asyncio.Event()
        async with gate:
            spec = LaunchSpec(subjob_id, "job", ["true"], {}, str(root), [])
            await executor.launch(spec)
            await ended[subjob_id].wait()

    await one(-1)  # starts the launcher
    assert executor._launcher is not None
    launcher = executor._launcher.pid
    launcher_before, faults_before, self_before = _cpu_and_faults(launcher)
    own_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(launches)))
    elapsed = time.perf_counter() - started
    own_after = resource.getrusage(resource.RUSAGE_SELF)
    while True:  # the last subjobs (or supervisors) are reaped by the launcher shortly after
        launcher_after, faults_after, self_after = _cpu_and_faults(launcher)
        await asyncio.sleep(0.2)
        if _cpu_and_faults(launcher) == (launcher_after, faults_after, self_after):
            break
    await executor.close()
    _remove(cgroups)
    own = own_after.ru_utime + own_after.ru_stime - own_before.ru_utime - own_before.ru_stime
    return {
        "launches": launches,
        "concurrency": concurrency,
        "cgroups": cgroups is not None,
        "agent_cpu_ms_per_launch": round(1000 * own / launches, 3),
        "launcher_cpu_ms_per_launch": round(
            1000 * (launcher_after - launcher_before) / launches, 3
        ),
        "launcher_own_cpu_ms_per_launch": round(1000 * (self_after - self_before) / launches, 3),
        "launcher_page_faults_per_launch": round((faults_after - faults_before) / launches, 1),
        "launches_per_second": round(launches / elapsed, 1),
        "failed": sum(1 for i in range(launches) if codes.get(f"s{i}") != 0),
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
