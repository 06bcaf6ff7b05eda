"""Trace readers: good files parse, bad ones fail naming the file and the column."""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from laminar_sim import traces
from laminar_sim.traces import TraceError

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def test_reads_nodes_and_pods(tiny_trace: Path) -> None:
    nodes = traces.read_nodes(traces.node_list_path(tiny_trace))
    assert [n.num_gpu for n in nodes] == [8] * 16
    assert nodes[0].model == "T4" and nodes[15].model == "V100M16"
    pods = traces.read_pods(traces.pod_list_path(tiny_trace, "tiny"))
    assert len(pods) == 12
    assert pods[1].shape.is_shared and pods[1].shape.gpu_milli == 500
    assert pods[3].shape.num_gpu == 0 and pods[3].shape.gpu_models == ()
    assert pods[7].shape.gpu_models == ("T4", "V100M16")
    assert traces.available_workloads(tiny_trace) == ["tiny"]


def test_node_without_gpus_has_no_model(tmp_path: Path) -> None:
    path = tmp_path / "openb_node_list_gpu_node.csv"
    path.write_text(NODE_HEADER + "n0,16000,65536,0,\n")
    (node,) = traces.read_nodes(path)
    assert node.num_gpu == 0 and node.model == ""


def test_pod_list_without_gpu_spec_column(tmp_path: Path) -> None:
    path = tmp_path / "openb_pod_list_x.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,1,1000\n")
    (pod,) = traces.read_pods(path)
    assert pod.shape.gpu_models == () and pod.shape.num_gpu == 1


@pytest.mark.parametrize(
    ("row", "needle"),
    [
        ("p0,abc,1024,1,1000,,LS,Running,0,1,0\n", "column 'cpu_milli' is 'abc'"),
        ("p0,1000,1024,2,500,,LS,Running,0,1,0\n", "only single-GPU pods may share"),
        ("p0,1000,1024,1,1500,,LS,Running,0,1,0\n", "above 1000"),
        ("p0,1000,1024,0,300,,LS,Running,0,1,0\n", "with num_gpu 0"),
        ("p0,1000,-5,1,1000,,LS,Running,0,1,0\n", "column 'memory_mib' is negative"),
        ("p0,1000,1024\n", "wrong number of fields"),
    ],
)
def test_bad_pod_rows_name_file_line_and_column(tmp_path: Path, row: str, needle: str) -> None:
    path = tmp_path / "openb_pod_list_bad.csv"
    path.write_text(POD_HEADER + row)
    with pytest.raises(TraceError) as err:
        traces.read_pods(path)
    assert needle in err.value.message
    assert "openb_pod_list_bad.csv:2" in err.value.message


def test_missing_column_and_missing_file_are_named(tmp_path: Path) -> None:
    path = tmp_path / "openb_node_list_gpu_node.csv"
    path.write_text("sn,cpu_milli,gpu,model\nn0,1000,1,T4\n")
    with pytest.raises(TraceError, match=r"missing column\(s\) memory_mib"):
        traces.read_nodes(path)
    with pytest.raises(TraceError, match="does not exist"):
        traces.read_nodes(tmp_path / "nope.csv")
    path.write_text(NODE_HEADER + "n0,1000,1024,2,\n")
    with pytest.raises(TraceError, match="'model' is empty"):
        traces.read_nodes(path)
    with pytest.raises(TraceError, match="--workload"):
        traces.pod_list_path(tmp_path, "../etc/passwd")


def test_bundled_lists_are_the_default_trace(traces_dir: Path) -> None:
    """The copy shipped in the package is byte-identical to the shared trace."""
    shared = traces_dir / "alibaba-gpu-v2023"
    bundled = traces.bundled_trace_dir()
    for name in ("openb_node_list_gpu_node.csv", "openb_pod_list_default.csv"):
        assert filecmp.cmp(shared / name, bundled / name, shallow=False), name
    assert (bundled / "ATTRIBUTION.md").is_file()


def test_every_shared_pod_list_parses(traces_dir: Path) -> None:
    folder = traces_dir / "alibaba-gpu-v2023"
    nodes = traces.read_nodes(traces.node_list_path(folder))
    assert len(nodes) == 1213 and sum(n.num_gpu for n in nodes) == 6212
    for workload in traces.available_workloads(folder):
        pods = traces.read_pods(traces.pod_list_path(folder, workload))
        assert len(pods) > 1000, workload
