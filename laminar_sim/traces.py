"""Readers for the Alibaba GPU trace 2023 ("openb") node and pod lists.

The files come from github.com/alibaba/clusterdata (cluster-trace-gpu-v2023);
see ``SOURCE.md`` beside them. Node lists have ``sn,cpu_milli,memory_mib,gpu,
model``; pod lists have ``name,cpu_milli,memory_mib,num_gpu,gpu_milli`` and,
in most files, ``gpu_spec`` (accepted GPU models joined by ``|``; empty means
any) followed by columns the placement experiments do not use (qos, phase,
times). Bad input raises :class:`TraceError` naming the file, line and column.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from laminar_base.errors import InvalidArgument
from laminar_sim.policies import MILLI, PodShape

NODE_LIST_FILE = "openb_node_list_gpu_node.csv"
POD_LIST_PATTERN = "openb_pod_list_{}.csv"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
_WORKLOAD_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class TraceError(InvalidArgument):
    """A trace file is missing or malformed; the message names the file and column."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    model: str


@dataclass(frozen=True, slots=True)
class PodSpec:
    name: str
    shape: PodShape


def bundled_trace_dir() -> Path:
    """The small default node and pod lists shipped with the package (see its ATTRIBUTION.md)."""
    return Path(str(resources.files("laminar_sim") / "data"))


def node_list_path(trace_dir: Path) -> Path:
    return trace_dir / NODE_LIST_FILE


def pod_list_path(trace_dir: Path, workload: str) -> Path:
    """``openb_pod_list_<workload>.csv`` in ``trace_dir``; the name must be a plain word."""
    if not _WORKLOAD_NAME.match(workload):
        raise TraceError(f"not a pod list name: {workload!r}", field="--workload")
    return trace_dir / POD_LIST_PATTERN.format(workload)


def available_workloads(trace_dir: Path) -> list[str]:
    prefix, suffix = POD_LIST_PATTERN.split("{}")
    return sorted(
        p.name[len(prefix) : -len(suffix)]
        for p in trace_dir.glob(POD_LIST_PATTERN.format("*"))
        if p.is_file()
    )


def read_nodes(path: Path) -> list[NodeSpec]:
    """Nodes of a node list; a node without GPUs has an empty model."""
    nodes: list[NodeSpec] = []
    for line, row in _rows(path, NODE_COLUMNS):
        num_gpu = _int(path, line, row, "gpu")
        model = row["model"].strip()
        if num_gpu > 0 and not model:
            raise TraceError(f"{path.name}:{line}: column 'model' is empty for a GPU node")
        nodes.append(
            NodeSpec(
                name=row["sn"].strip(),
                cpu_milli=_int(path, line, row, "cpu_milli"),
                memory_mib=_int(path, line, row, "memory_mib"),
                num_gpu=num_gpu,
                model=model,
            )
        )
    if not nodes:
        raise TraceError(f"{path.name}: no nodes")
    return nodes


def read_pods(path: Path) -> list[PodSpec]:
    """Pods of a pod list, in file order.

    A pod asks for ``num_gpu`` GPUs with ``gpu_milli`` thousandths of each:
    sharing (``gpu_milli < 1000``) is only allowed for one GPU.
    """
    pods: list[PodSpec] = []
    for line, row in _rows(path, POD_COLUMNS):
        num_gpu = _int(path, line, row, "num_gpu")
        gpu_milli = _int(path, line, row, "gpu_milli")
        where = f"{path.name}:{line}"
        if gpu_milli > MILLI:
            raise TraceError(f"{where}: column 'gpu_milli' is {gpu_milli}, above {MILLI}")
        if num_gpu == 0 and gpu_milli != 0:
            raise TraceError(f"{where}: column 'gpu_milli' is {gpu_milli} with num_gpu 0")
        if num_gpu > 0 and gpu_milli == 0:
            raise TraceError(f"{where}: column 'gpu_milli' is 0 with num_gpu {num_gpu}")
        if num_gpu > 1 and gpu_milli != MILLI:
            raise TraceError(
                f"{where}: column 'gpu_milli' is {gpu_milli} with num_gpu {num_gpu}; "
                "only single-GPU pods may share a GPU"
            )
        spec = (row.get("gpu_spec") or "").strip()
        models = tuple(sorted({m for m in spec.split("|") if m})) if num_gpu > 0 else ()
        pods.append(
            PodSpec(
                name=row["name"].strip(),
                shape=PodShape(
                    cpu_milli=_int(path, line, row, "cpu_milli"),
                    memory_mib=_int(path, line, row, "memory_mib"),
                    num_gpu=num_gpu,
                    gpu_milli=gpu_milli,
                    gpu_models=models,
                ),
            )
        )
    if not pods:
        raise TraceError(f"{path.name}: no pods")
    return pods


def _rows(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise TraceError(f"trace file {path} does not exist")
    with path.open(newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(f"{path.name}: missing column(s) {', '.join(missing)}")
        for row in reader:
            if None in row or any(row[c] is None for c in required):
                raise TraceError(f"{path.name}:{reader.line_num}: wrong number of fields")
            yield reader.line_num, row


def _int(path: Path, line: int, row: dict[str, str], column: str) -> int:
    text = row[column].strip()
    try:
        value = int(text)
    except ValueError:
        raise TraceError(
            f"{path.name}:{line}: column '{column}' is {text!r}, not an integer"
        ) from None
    if value < 0:
        raise TraceError(f"{path.name}:{line}: column '{column}' is negative ({value})")
    return value
