"""NVML backend: a clean Unavailable without a GPU, a real topology read with one."""

from __future__ import annotations

import pytest

from laminar_agent.inventory import open_backend
from laminar_agent.inventory.nvml import NvmlBackend
from laminar_base.errors import Unavailable


def _nvml_or_reason() -> NvmlBackend | str:
    try:
        return NvmlBackend()
    except Unavailable as exc:
        return str(exc)


def test_unavailable_is_a_clean_error() -> None:
    result = _nvml_or_reason()
    if isinstance(result, NvmlBackend):
        result.close()
        pytest.skip("NVML is available here; the no-GPU error path cannot be exercised")
    assert result.startswith("NVML not available: ")
    with pytest.raises(Unavailable) as info:
        open_backend("nvml", fake_spec="", agent_id="a")
    assert info.value.retryable
    assert "\n" not in str(info.value)


def test_real_gpu_topology_and_memory() -> None:
    result = _nvml_or_reason()
    if isinstance(result, str):
        print(f"skipping: {result}")
        pytest.skip(f"needs a GPU: {result}")
    backend = result
    try:
        gpus = backend.gpus()
        assert gpus, "NVML initialised but reports no GPUs"
        used = backend.memory_used()
        for gpu in gpus:
            assert gpu.uuid.startswith("GPU-")
            assert gpu.memory_total_bytes > 0
            assert used[gpu.uuid][1] == gpu.memory_total_bytes
            assert 0 <= used[gpu.uuid][0] <= gpu.memory_total_bytes
            for mig in gpu.mig_instances:
                assert mig.uuid.startswith("MIG-")
                assert 0 < used[mig.uuid][1] <= gpu.memory_total_bytes
        assert backend.driver_version()
        backend.refresh()
        assert [g.uuid for g in backend.gpus()] == [g.uuid for g in gpus]
    finally:
        backend.close()
        backend.close()  # idempotent
