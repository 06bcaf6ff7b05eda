"""Per-process GPU memory charged to subjobs through their process trees."""

from __future__ import annotations

import subprocess
import sys

from laminar_agent.inventory.attribution import attribute_gpu_memory
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockMig, MockNvml

GIB = 1 << 30
#: child -> parent: subjob roots 100 and 200; 101 and 102 under 100; 201 under 200; 300 alone.
PARENTS = {101: 100, 102: 101, 100: 1, 201: 200, 200: 1, 300: 1}


def test_processes_are_charged_to_their_nearest_subjob_root() -> None:
    mock = MockNvml(
        [
            MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB, processes={102: 7 * GIB, 300: GIB}),
            MockGpu(
                "NVIDIA A100-SXM4-40GB",
                40 * GIB,
                mig_capable=True,
                migs=[MockMig("3g.20gb", 20 * GIB, 0, 4, processes={101: 2 * GIB, 201: 3 * GIB})],
            ),
        ]
    )
    backend = NvmlBackend(nvml=mock)
    h100, a100 = backend.gpus()
    mig = a100.mig_instances[0].uuid
    asked: list[int] = []

    def parent_of(pid: int) -> int | None:
        asked.append(pid)
        return PARENTS.get(pid)

    result = attribute_gpu_memory(
        backend.process_memory(), {100: "s-a", 200: "s-b"}, parent_of=parent_of
    )
    assert result.by_subjob == {"s-a": {h100.uuid: 7 * GIB, mig: 2 * GIB}, "s-b": {mig: 3 * GIB}}
    assert result.unattributed == {h100.uuid: GIB}
    assert len(asked) == len(set(asked))  # each pid's parent looked up once
    backend.close()


def test_a_real_grandchild_is_charged_to_its_subjob() -> None:
    code = (
        "import subprocess, sys; "
        "c = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'], "
        "stdin=subprocess.PIPE); print(c.pid, flush=True); sys.stdin.read(); "
        "c.stdin.close(); c.wait()"
    )
    root = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert root.stdout is not None
        grandchild = int(root.stdout.readline())
        result = attribute_gpu_memory({"GPU-x": {grandchild: GIB, 1: GIB}}, {root.pid: "s-1"})
        assert result.by_subjob == {"s-1": {"GPU-x": GIB}}
        assert result.unattributed == {"GPU-x": GIB}
    finally:
        assert root.stdin is not None and root.stdout is not None
        root.stdin.close()
        root.stdout.close()
        root.wait(timeout=30)
