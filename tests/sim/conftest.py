"""Tiny synthetic openb-format traces for the simulator's tests."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time\n"
)


def write_trace(folder: Path, nodes: list[str], pods: list[str], workload: str = "tiny") -> Path:
    """Write a node list and ``openb_pod_list_<workload>.csv`` with the given data rows."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "openb_node_list_gpu_node.csv").write_text(NODE_HEADER + "".join(nodes))
    (folder / f"openb_pod_list_{workload}.csv").write_text(POD_HEADER + "".join(pods))
    return folder


@pytest.fixture
def make_trace() -> Callable[[Path, list[str], list[str], str], Path]:
    """The trace writer, for tests that need their own rows."""
    return write_trace


@pytest.fixture
def tiny_trace(tmp_path: Path) -> Path:
    """Sixteen 8-GPU nodes of two models and a dozen pod shapes of at most two GPUs.

    Small enough to run in a blink, fine-grained enough (one GPU is 0.8% of the
    cluster) that every arrived level from 75% to 130% is observed.
    """
    nodes = [f"t{i},96000,393216,8,T4\n" for i in range(10)] + [
        f"v{i},96000,393216,8,V100M16\n" for i in range(6)
    ]
    pods = [
        f"p{i:02d},{cpu},{mem},{num},{milli},{spec},LS,Running,0,1,0\n"
        for i, (cpu, mem, num, milli, spec) in enumerate(
            [
                (4000, 8192, 1, 1000, ""),
                (2000, 4096, 1, 500, ""),
                (2000, 4096, 1, 250, ""),
                (8000, 16384, 0, 0, ""),
                (4000, 8192, 1, 1000, "T4"),
                (6000, 8192, 2, 1000, ""),
                (2000, 4096, 1, 500, ""),
                (1000, 2048, 1, 300, "V100M16|T4"),
                (4000, 8192, 1, 1000, ""),
                (2000, 4096, 1, 500, ""),
                (12000, 32768, 1, 1000, "V100M16"),
                (2000, 4096, 1, 700, ""),
            ]
        )
    ]
    return write_trace(tmp_path / "trace", nodes, pods)
