"""The real NvmlBackend on a mocked NVML: inventory, names, faults and per-process memory."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pynvml
import pytest
from waiting import wait_for

from laminar_agent.config import AgentConfig, InventorySettings
from laminar_agent.inventory import open_backend
from laminar_agent.inventory.base import GpuInfo
from laminar_agent.inventory.model_names import canonical_model
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockMig, MockNvml
from laminar_agent.metrics import AgentMetrics
from laminar_agent.state import AgentState
from laminar_base.demand import Demand
from laminar_base.errors import ConfigError, InvalidArgument, Unavailable

GIB = 1 << 30


@pytest.mark.parametrize(
    ("nvml_name", "memory_gib", "canonical"),
    [
        ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB"),
        ("NVIDIA H100 PCIe", 79.6, "H100-80GB"),
        ("NVIDIA H100 NVL", 93.6, "H100-94GB"),
        ("NVIDIA H200", 140.4, "H200-141GB"),
        ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 79.2, "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", 79.2, "A100-80GB"),
        ("NVIDIA A100-PCIE-40GB", 39.4, "A100-40GB"),
        ("NVIDIA L4", 22.5, "L4-24GB"),
        ("NVIDIA L40S", 44.4, "L40S-48GB"),
        ("Tesla T4", 14.7, "T4-16GB"),
        ("Tesla V100-SXM2-16GB", 15.8, "V100-16GB"),
        ("Tesla V100-SXM2-32GB", 31.7, "V100-32GB"),
        ("NVIDIA A800 something", 80.0, "A800-80GB"),  # size from memory when the name has none
        ("NVIDIA GeForce RTX 4090", 24.0, "GEFORCE-RTX-4090"),  # unknown: a clean form
        ("  weird/name  v2 ", 0.0, "WEIRD-NAME-V2"),
        ("", 0.0, "UNKNOWN"),
    ],
)
def test_canonical_model_names(nvml_name: str, memory_gib: float, canonical: str) -> None:
    assert canonical_model(nvml_name, int(memory_gib * GIB)) == canonical


def _mock() -> MockNvml:
    """GPU 0: a whole H100 with two processes; GPU 1: an A100 in MIG mode (two instances)."""
    return MockNvml(
        [
            MockGpu(
                "NVIDIA H100 80GB HBM3",
                80 * GIB,
                used_bytes=GIB,
                processes={4242: 10 * GIB, 4343: 5 * GIB},
            ),
            MockGpu(
                "NVIDIA A100-SXM4-40GB",
                40 * GIB,
                mig_capable=True,
                migs=[
                    MockMig("3g.20gb", 20 * GIB, start=0, size=4, processes={77: 3 * GIB}),
                    MockMig("2g.10gb", 10 * GIB, start=4, size=2),
                ],
            ),
        ]
    )


def test_inventory_of_whole_and_mig_gpus_through_the_real_backend() -> None:
    backend = NvmlBackend(shared_indices=frozenset({0}), nvml=_mock())
    try:
        h100, a100 = backend.gpus()
        assert (h100.index, h100.model, h100.memory_total_bytes) == (0, "H100-80GB", 80 * GIB)
        assert h100.uuid.startswith("GPU-") and h100.shared and not h100.mig_enabled
        assert (a100.model, a100.mig_enabled, a100.shared) == ("A100-40GB", True, False)
        assert [(m.profile, m.start, m.size) for m in a100.mig_instances] == [
            ("3g.20gb", 0, 4),
            ("2g.10gb", 4, 2),
        ]
        assert all(m.uuid.startswith("MIG-") for m in a100.mig_instances)
        used = backend.memory_used()
        assert used[h100.uuid] == (16 * GIB, 80 * GIB)  # base + both processes
        assert used[a100.mig_instances[0].uuid] == (3 * GIB, 20 * GIB)
        assert used[a100.uuid] == (3 * GIB, 40 * GIB)
        assert backend.driver_version() == "550.54.15"
        assert backend.degraded() == {}
    finally:
        backend.close()
        backend.close()  # idempotent


def test_per_process_memory_on_gpus_and_mig_instances() -> None:
    mock = _mock()
    backend = NvmlBackend(nvml=mock)
    h100, a100 = backend.gpus()
    small, spare = a100.mig_instances
    assert backend.process_memory() == {
        h100.uuid: {4242: 10 * GIB, 4343: 5 * GIB},
        small.uuid: {77: 3 * GIB},
        spare.uuid: {},
    }
    mock.gpus[1].migs[1].processes[88] = 2 * GIB  # a process starts on the second instance
    del mock.gpus[0].processes[4343]
    assert backend.process_memory()[spare.uuid] == {88: 2 * GIB}
    assert backend.process_memory()[h100.uuid] == {4242: 10 * GIB}
    assert backend.memory_used()[h100.uuid][0] == 11 * GIB


#: Every NVML call the backend makes after start-up, and the pass that makes it.
_CALLS = [
    ("nvmlDeviceGetHandleByIndex", "refresh"),
    ("nvmlDeviceGetUUID", "refresh"),
    ("nvmlDeviceGetName", "refresh"),
    ("nvmlDeviceGetMigMode", "refresh"),
    ("nvmlDeviceGetMaxMigDeviceCount", "refresh"),
    ("nvmlDeviceGetMigDeviceHandleByIndex", "refresh"),
    ("nvmlDeviceGetGpuInstanceId", "refresh"),
    ("nvmlDeviceGetGpuInstanceById", "refresh"),
    ("nvmlGpuInstanceGetInfo", "refresh"),
    ("nvmlDeviceGetMemoryInfo", "refresh"),
    ("nvmlDeviceGetMemoryInfo", "memory_used"),
    ("nvmlDeviceGetComputeRunningProcesses", "process_memory"),
]


@pytest.mark.parametrize(("call", "method"), _CALLS)
def test_a_failing_call_degrades_the_gpu_and_it_recovers(call: str, method: str) -> None:
    mock = _mock()
    backend = NvmlBackend(nvml=mock)
    h100, a100 = backend.gpus()
    is_mig_only = ("Mig" in call and call != "nvmlDeviceGetMigMode") or "Instance" in call
    for gpu in (1,) if is_mig_only else (0, 1):  # MIG layout calls reach only the MIG GPU
        target = (h100, a100)[gpu]
        mock.fail(call, pynvml.NVML_ERROR_UNKNOWN, gpu=gpu)
        getattr(backend, method)()  # no exception reaches the caller
        assert call in backend.degraded()[target.uuid]
        assert set(backend.degraded()) == {target.uuid}
        assert [g.uuid for g in backend.gpus()] == [h100.uuid, a100.uuid]  # last record kept
        readings = backend.memory_used()
        if call == "nvmlDeviceGetMemoryInfo":
            assert target.uuid not in readings  # polls skip the degraded GPU...
            assert (a100, h100)[gpu].uuid in readings  # ...and only that one
        else:
            assert {h100.uuid, a100.uuid} <= set(readings)
        mock.heal(call)
        getattr(backend, method)()
        backend.memory_used()
        assert backend.degraded() == {}
        assert backend.gpus() == (h100, a100)


def test_count_failure_degrades_every_gpu_and_a_lost_gpu_recovers() -> None:
    mock = _mock()
    backend = NvmlBackend(nvml=mock)
    h100, a100 = backend.gpus()
    mock.fail("nvmlDeviceGetCount", pynvml.NVML_ERROR_TIMEOUT)
    backend.refresh()
    assert set(backend.degraded()) == {h100.uuid, a100.uuid}
    assert "Timeout" in backend.degraded()[h100.uuid]
    mock.heal()
    backend.refresh()
    assert backend.degraded() == {}

    mock.gpus[0].is_lost = True  # falls off the bus
    assert set(backend.memory_used()) == {a100.uuid, *(m.uuid for m in a100.mig_instances)}
    assert "GPU is lost" in backend.degraded()[h100.uuid]
    backend.refresh()
    assert backend.gpus() == (h100, a100)
    mock.gpus[0].is_lost = False
    backend.memory_used()
    assert h100.uuid in backend.degraded()  # the topology pass has not seen it back yet
    backend.refresh()
    assert backend.degraded() == {}


def test_a_hung_call_costs_one_deadline_and_the_gpus_recover_when_it_returns() -> None:
    mock = _mock()
    backend = NvmlBackend(nvml=mock, call_deadline_seconds=0.5)
    h100, a100 = backend.gpus()
    release = threading.Event()
    mock.hang("nvmlDeviceGetMemoryInfo", release)
    try:
        assert backend.memory_used() == {}  # returns: the hung call did not block it for good
        degraded = backend.degraded()
        assert "no answer within 0.5 s" in degraded[h100.uuid]
        assert "still hung" in degraded[a100.uuid]  # failed at once, behind the hung call
        assert backend.process_memory() == {}  # every call fails fast while one hangs
        mock.heal()
    finally:
        release.set()

    def recovered() -> bool:
        backend.memory_used()
        backend.process_memory()
        return backend.degraded() == {}

    wait_for(recovered)
    assert set(backend.memory_used()) == {
        h100.uuid,
        a100.uuid,
        *(m.uuid for m in a100.mig_instances),
    }
    backend.close()


def test_a_gpu_lost_at_start_is_left_out_until_it_answers() -> None:
    mock = _mock()
    mock.gpus[0].is_lost = True
    mock.fail("nvmlSystemGetDriverVersion", pynvml.NVML_ERROR_NOT_SUPPORTED)
    backend = NvmlBackend(nvml=mock)  # starts on what answers
    assert [g.model for g in backend.gpus()] == ["A100-40GB"]
    assert "GPU is lost" in backend.degraded()["gpu0"]
    assert backend.driver_version() == ""
    mock.gpus[0].is_lost = False
    backend.refresh()
    assert [g.model for g in backend.gpus()] == ["H100-80GB", "A100-40GB"]
    assert backend.degraded() == {}
    mock.fail("nvmlShutdown", pynvml.NVML_ERROR_UNINITIALIZED)
    backend.close()  # a failed shutdown is not an error


def test_mock_raises_pynvml_error_classes() -> None:
    mock = _mock()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        mock.nvmlDeviceGetCount()
    mock.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        mock.nvmlDeviceGetMigMode(mock.nvmlDeviceGetHandleByIndex(0))
    with pytest.raises(pynvml.NVMLError_NotFound):
        mock.nvmlDeviceGetMigDeviceHandleByIndex(mock.nvmlDeviceGetHandleByIndex(1), 5)
    assert mock.NVMLError_GpuIsLost is pynvml.NVMLError_GpuIsLost
    with pytest.raises(InvalidArgument):
        mock.fail("nvmlNoSuchCall")


def test_init_failure_is_unavailable_and_scenario_file_selects_the_mock(tmp_path: Path) -> None:
    mock = _mock()
    mock.fail("nvmlInit", pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(Unavailable, match="Driver Not Loaded"):
        NvmlBackend(nvml=mock)

    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps(
            {
                "gpus": [
                    {"name": "NVIDIA H200", "memory_total_bytes": 141 * GIB},
                    {
                        "name": "NVIDIA A100 80GB PCIe",
                        "memory_total_bytes": 80 * GIB,
                        "migs": [
                            {
                                "profile": "7g.80gb",
                                "memory_total_bytes": 80 * GIB,
                                "start": 0,
                                "size": 8,
                                "processes": {"12": GIB},
                            }
                        ],
                    },
                ]
            }
        )
    )
    backend = open_backend("nvml", fake_spec="", agent_id="a", nvml_mock=str(scenario))
    try:
        assert backend.name == "nvml"
        assert [g.model for g in backend.gpus()] == ["H200-141GB", "A100-80GB"]
        mig = backend.gpus()[1].mig_instances[0]
        assert backend.memory_used()[mig.uuid] == (GIB, 80 * GIB)
    finally:
        backend.close()
    scenario.write_text('{"gpus": [{"name": "x"}]}')
    with pytest.raises(InvalidArgument) as info:
        open_backend("nvml", fake_spec="", agent_id="a", nvml_mock=str(scenario))
    assert info.value.field == "inventory.nvml_mock"


def test_the_mock_is_only_selected_with_the_nvml_backend() -> None:
    assert AgentConfig().inventory.nvml_mock == ""  # never by default
    AgentConfig(inventory=InventorySettings(nvml_mock="scenario.json")).validate()
    with pytest.raises(ConfigError) as info:
        AgentConfig(inventory=InventorySettings(gpu_backend="fake", nvml_mock="x.json")).validate()
    assert info.value.field == "inventory.nvml_mock"


def test_a_degraded_gpu_takes_no_new_work_until_it_answers(tmp_path: Path) -> None:
    """The agent holds a GPU whose driver calls fail back from new work (its slices are
    reserved for no one), says so in a gauge, and gives it back when it answers."""
    mock = _mock()
    backend = NvmlBackend(nvml=mock)
    metrics = AgentMetrics()
    state = AgentState("h", backend, metrics, tmp_path)
    h100 = backend.gpus()[0]
    whole = Demand(gpus=1)
    assert not isinstance(state.node.ledger.fit(whole), str)  # the H100 takes a whole GPU
    mock.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=0)
    state.poll_memory()
    assert h100.uuid in backend.degraded()
    assert isinstance(state.node.ledger.fit(whole), str)  # held back: nothing fits
    assert free_whole_gpus(state) == 0  # and the router is not told there is one
    assert metrics.registry.get_sample_value("laminar_agent_gpus_degraded") == 1
    mock.heal()
    state.poll_memory()
    assert not isinstance(state.node.ledger.fit(whole), str)
    assert free_whole_gpus(state) == 1
    assert metrics.registry.get_sample_value("laminar_agent_gpus_degraded") == 0


def free_whole_gpus(state: AgentState) -> int:
    """Whole GPUs the agent's summary advertises free."""
    return sum(s.free for s in state.summary_message().shapes if s.shape.startswith("gpu:"))


def test_gpu_metrics_carry_dcgm_exporter_labels(tmp_path: Path) -> None:
    """Per-device series are labelled as dcgm-exporter labels its own (gpu, UUID, device,
    modelName, GPU_I_PROFILE, GPU_I_ID), so dashboards can join the two; a MIG instance
    carries its GPU's index, UUID and device file with its profile and instance id."""
    backend = NvmlBackend(nvml=_mock())
    metrics = AgentMetrics()
    state = AgentState("h", backend, metrics, tmp_path)
    state.poll_memory()
    h100, a100 = backend.gpus()
    mig = a100.mig_instances[0]

    def labels(device: str, gi_profile: str, gi_id: str, gpu: GpuInfo) -> dict[str, str]:
        return {
            "gpu": str(gpu.index),
            "UUID": gpu.uuid,
            "device": device,
            "modelName": gpu.model,
            "GPU_I_PROFILE": gi_profile,
            "GPU_I_ID": gi_id,
        }

    sample = metrics.registry.get_sample_value
    whole = labels("nvidia0", "", "", h100)
    assert sample("laminar_agent_gpu_memory_used_bytes", whole) == 16 * GIB
    assert sample("laminar_agent_gpu_memory_total_bytes", whole) == 80 * GIB
    assert sample("laminar_airlock_level", whole) == 1
    instance = labels("nvidia1", "3g.20gb", "1", a100)
    assert (mig.profile, mig.gpu_instance_id) == ("3g.20gb", 1)
    assert sample("laminar_agent_gpu_memory_used_bytes", instance) == 3 * GIB
    assert sample("laminar_agent_gpu_memory_total_bytes", instance) == 20 * GIB
    host = dict.fromkeys(("gpu", "UUID", "modelName", "GPU_I_PROFILE", "GPU_I_ID"), "")
    assert sample("laminar_airlock_level", {**host, "device": "host"}) == 1
