"""MIG on demand on the nvml backend: NvmlBackend.apply_mig_layout over the mocked NVML's
GPU-instance calls (issue 16): new instances with their compute instance, kept ones with
their UUID, a busy or non-MIG GPU refused, a failure part way finished by the next try."""

from __future__ import annotations

from collections.abc import Iterator

import pynvml
import pytest

from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockMig, MockNvml
from laminar_base.errors import FailedPrecondition, InvalidArgument, Unavailable

GIB = 1 << 30
H100 = "NVIDIA H100 80GB HBM3"


def _seven_small() -> list[MockMig]:
    return [MockMig("1g.10gb", 10 * GIB, start, 1) for start in range(7)]


@pytest.fixture
def mock() -> MockNvml:
    return MockNvml(
        [
            MockGpu(H100, 80 * GIB, mig_capable=True, migs=_seven_small()),
            MockGpu(H100, 80 * GIB),  # a whole GPU, MIG off
        ]
    )


@pytest.fixture
def backend(mock: MockNvml) -> Iterator[NvmlBackend]:
    b = NvmlBackend(nvml=mock, call_deadline_seconds=5.0)
    yield b
    b.close()


def _layout(backend: NvmlBackend, index: int = 0) -> list[tuple[str, int]]:
    gpu = next(g for g in backend.gpus() if g.index == index)
    return [(m.profile, m.start) for m in gpu.mig_instances]


def test_an_idle_gpu_gets_the_layout_and_its_instances_are_mig_devices(
    backend: NvmlBackend, mock: MockNvml
) -> None:
    got = backend.apply_mig_layout(0, [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)])
    assert [(m.profile, m.start, m.size) for m in got] == [
        ("3g.40gb", 0, 4),
        ("3g.40gb", 4, 4),
    ]
    assert all(m.memory_total_bytes == 40 * GIB and m.uuid.startswith("MIG-") for m in got)
    assert _layout(backend) == [("3g.40gb", 0), ("3g.40gb", 4)]
    # NVML itself holds exactly these two GPU instances, each with its compute instance.
    assert [(m.profile, m.start, m.has_ci) for m in mock.gpus[0].migs] == [
        ("3g.40gb", 0, True),
        ("3g.40gb", 4, True),
    ]
    used = backend.memory_used()
    assert {used[m.uuid][1] for m in got} == {40 * GIB}


def test_an_instance_that_stays_keeps_its_uuid_and_new_ones_get_new_uuids(
    backend: NvmlBackend,
) -> None:
    before = {(m.profile, m.start): m.uuid for m in backend.gpus()[0].mig_instances}
    got = backend.apply_mig_layout(0, [("3g.40gb", 0, 4), ("1g.10gb", 4, 1), ("1g.10gb", 5, 1)])
    after = {(m.profile, m.start): m.uuid for m in got}
    assert after[("1g.10gb", 4)] == before[("1g.10gb", 4)]
    assert after[("1g.10gb", 5)] == before[("1g.10gb", 5)]
    assert after[("3g.40gb", 0)] not in before.values()
    # Back to small instances: the 3g is destroyed, and no UUID is ever handed out twice.
    again = backend.apply_mig_layout(0, [("1g.10gb", s, 1) for s in range(7)])
    assert len({m.uuid for m in again}) == 7
    assert after[("3g.40gb", 0)] not in {m.uuid for m in again}
    assert {m.uuid for m in again}.isdisjoint(set(before.values()) - set(after.values()))


def test_an_instance_nvml_lists_a_process_on_is_never_destroyed(
    backend: NvmlBackend, mock: MockNvml
) -> None:
    mock.gpus[0].migs[3].processes[4242] = GIB
    with pytest.raises(Unavailable) as err:
        backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    assert "runs processes on" in err.value.message
    assert _layout(backend) == [("1g.10gb", s) for s in range(7)]
    assert len(mock.gpus[0].migs) == 7
    # A layout that destroys 1g@0 and 1g@1 only may go ahead: the busy 1g@3 is not touched.
    got = backend.apply_mig_layout(
        0, [("2g.20gb", 0, 2), *[("1g.10gb", s, 1) for s in range(2, 7)]]
    )
    assert [(m.profile, m.start) for m in got][:2] == [("2g.20gb", 0), ("1g.10gb", 2)]
    busy = mock.gpus[0].migs[2]
    assert (busy.start, busy.has_ci, busy.processes) == (3, True, {4242: GIB})


def test_a_busy_gpu_changes_only_its_idle_part(backend: NvmlBackend, mock: MockNvml) -> None:
    """Carving (issue 16): the 1g instances at 4, 5 and 6 give way to a 3g at 4 while the
    instances at 0 to 3 run on, keeping their GPU instance, compute instance and UUID."""
    for mig in mock.gpus[0].migs[:4]:
        mig.processes[100 + mig.start] = GIB
    before = {m.start: (m.gpu_instance_id, m.uuid) for m in backend.gpus()[0].mig_instances}
    gi_before = {m.start: m.gi_id for m in mock.gpus[0].migs}
    got = backend.apply_mig_layout(0, [*[("1g.10gb", s, 1) for s in range(4)], ("3g.40gb", 4, 4)])
    assert [(m.profile, m.start) for m in got] == [
        *[("1g.10gb", s) for s in range(4)],
        ("3g.40gb", 4),
    ]
    for m in got[:4]:
        assert (m.gpu_instance_id, m.uuid) == before[m.start]
    assert got[4].uuid not in {uuid for _, uuid in before.values()}
    assert [(m.start, m.gi_id, m.has_ci, m.processes) for m in mock.gpus[0].migs[:4]] == [
        (s, gi_before[s], True, {100 + s: GIB}) for s in range(4)
    ]
    assert (mock.gpus[0].migs[4].profile, mock.gpus[0].migs[4].has_ci) == ("3g.40gb", True)


def test_an_illegal_layout_or_a_gpu_without_mig_is_refused(backend: NvmlBackend) -> None:
    with pytest.raises(InvalidArgument):
        backend.apply_mig_layout(0, [("4g.40gb", 0, 4), ("4g.40gb", 4, 4)])  # 8 compute slices
    with pytest.raises(FailedPrecondition) as err:
        backend.apply_mig_layout(1, [("7g.80gb", 0, 8)])
    assert err.value.field == "inventory.mig_on_demand"
    assert _layout(backend) == [("1g.10gb", s) for s in range(7)]


def test_a_failure_part_way_is_unavailable_and_the_next_try_finishes_the_layout(
    backend: NvmlBackend, mock: MockNvml
) -> None:
    mock.fail("nvmlGpuInstanceCreateComputeInstance", pynvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(Unavailable) as err:
        backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    assert "nvmlGpuInstanceCreateComputeInstance" in str(err.value)
    # The old instances are gone and the new GPU instance has no compute instance: no
    # MIG device is left to use, and the backend says so.
    assert _layout(backend) == []
    assert [(m.profile, m.has_ci) for m in mock.gpus[0].migs] == [("7g.80gb", False)]
    mock.heal()
    got = backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    assert [(m.profile, m.start) for m in got] == [("7g.80gb", 0)]
    assert [(m.profile, m.has_ci) for m in mock.gpus[0].migs] == [("7g.80gb", True)]


def test_without_privileges_the_driver_refusal_is_named(
    backend: NvmlBackend, mock: MockNvml
) -> None:
    mock.fail("nvmlComputeInstanceDestroy", pynvml.NVML_ERROR_NO_PERMISSION)
    with pytest.raises(Unavailable) as err:
        backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    assert "nvmlComputeInstanceDestroy" in str(err.value)
    assert _layout(backend) == [("1g.10gb", s) for s in range(7)]


def test_the_mock_refuses_what_the_driver_refuses(mock: MockNvml) -> None:
    mock.nvmlInit()
    handle = mock.nvmlDeviceGetHandleByIndex(0)
    info = mock.nvmlDeviceGetGpuInstanceProfileInfo(
        handle, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE
    )
    assert (info.sliceCount, info.name) == (1, "MIG 1g.10gb")
    placement = pynvml.c_nvmlGpuInstancePlacement_t(start=0, size=1)
    with pytest.raises(pynvml.NVMLError_InsufficientResources):  # slot 0 is taken
        mock.nvmlDeviceCreateGpuInstanceWithPlacement(handle, info.id, placement)
    gi = mock.nvmlDeviceGetGpuInstanceById(handle, 1)
    with pytest.raises(pynvml.NVMLError_InUse):  # its compute instance goes first
        mock.nvmlGpuInstanceDestroy(gi)
    mock.gpus[0].migs[0].processes[7] = GIB
    ci = mock.nvmlGpuInstanceGetComputeInstanceById(gi, 0)
    with pytest.raises(pynvml.NVMLError_InUse):  # a process uses it
        mock.nvmlComputeInstanceDestroy(ci)
    bad = pynvml.c_nvmlGpuInstancePlacement_t(start=1, size=2)  # 2g.20gb starts at 0, 2, 4
    two = mock.nvmlDeviceGetGpuInstanceProfileInfo(handle, pynvml.NVML_GPU_INSTANCE_PROFILE_2_SLICE)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        mock.nvmlDeviceCreateGpuInstanceWithPlacement(handle, two.id, bad)
    whole = mock.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        mock.nvmlDeviceGetGpuInstanceProfileInfo(whole, pynvml.NVML_GPU_INSTANCE_PROFILE_1_SLICE)


def test_a_mig_instance_destroyed_between_listing_and_reading_degrades_no_gpu(
    backend: NvmlBackend, mock: MockNvml
) -> None:
    """A second backend over the same NVML still lists the instances the first destroyed
    (as a poll that listed the devices just before a repartition): its readings skip them
    and read the new topology, and the GPU is not degraded (it was, refusing work until
    the next poll: a MIG test failed half its runs on it)."""
    stale = NvmlBackend(nvml=mock, call_deadline_seconds=5.0)
    try:
        old = {m.uuid for m in stale.gpus()[0].mig_instances}
        new = backend.apply_mig_layout(0, [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)])
        used = stale.memory_used()
        assert stale.degraded() == {}
        assert old.isdisjoint(used)
        assert stale.process_memory() is not None and stale.degraded() == {}
        # The re-read topology is the new one: the next poll reads its instances.
        assert {m.uuid for m in new} <= set(stale.memory_used())
    finally:
        stale.close()
