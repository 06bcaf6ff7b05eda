"""Xid events and lost GPUs on the real NvmlBackend over the mocked NVML (issue 18): a
fatal Xid or a GPU that fell off the bus fails that GPU once (the agent ends its work),
keeps it degraded, and it recovers when NVML answers again."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from waiting import wait_for

from laminar_agent.inventory.nvml import NvmlBackend
from laminar_agent.inventory.nvml_mock import MockGpu, MockNvml

GIB = 1 << 30


@pytest.fixture
def mock() -> MockNvml:
    return MockNvml(
        [MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB), MockGpu("NVIDIA H100 80GB HBM3", 80 * GIB)]
    )


@pytest.fixture
def backend(mock: MockNvml) -> Iterator[NvmlBackend]:
    backend = NvmlBackend(nvml=mock, recover_after_seconds=0.2)
    try:
        yield backend
    finally:
        backend.close()


def test_a_fatal_xid_fails_its_gpu_once_and_it_recovers_after_its_hold(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    first, second = backend.gpus()
    mock.xid(1, 48)
    wait_for(lambda: second.uuid in backend.failed())
    failures = backend.take_failures()
    assert [(f.gpu_uuid, f.gpu_index, f.xid) for f in failures] == [(second.uuid, 1, 48)]
    assert "Xid 48: double-bit ECC error" in failures[0].reason
    assert set(backend.degraded()) == {second.uuid}
    mock.xid(1, 48)  # again while failed: the hold is extended, the failure not repeated
    wait_for(lambda: mock.pending_events() == 0)
    assert backend.take_failures() == []
    assert first.uuid not in backend.degraded()

    def polled_clean() -> bool:
        backend.memory_used()
        return backend.degraded() == {}

    # It keeps answering: once its hold has passed, a poll brings it back.
    wait_for(polled_clean)
    assert backend.failed() == {} and backend.take_failures() == []


def test_an_application_xid_is_left_to_the_application(
    mock: MockNvml, backend: NvmlBackend, caplog: pytest.LogCaptureFixture
) -> None:
    mock.xid(0, 13)  # graphics engine exception: the process's own fault
    wait_for(lambda: "reported Xid 13" in caplog.text)
    assert backend.failed() == {} and backend.take_failures() == []


def test_a_gpu_that_falls_off_the_bus_fails_once_and_recovers_when_it_answers(
    mock: MockNvml, backend: NvmlBackend
) -> None:
    first, _ = backend.gpus()
    mock.gpus[0].is_lost = True
    for _ in range(3):
        assert first.uuid not in backend.memory_used()
    failures = backend.take_failures()
    assert [(f.gpu_index, f.xid) for f in failures] == [(0, 0)]
    assert "fell off the bus" in failures[0].reason and "GPU is lost" in failures[0].reason
    assert "fell off the bus" in backend.degraded()[first.uuid]
    mock.gpus[0].is_lost = False
    assert first.uuid in backend.memory_used()  # no Xid hold: back on its first answer
    assert backend.failed() == {}


def test_a_followed_scenario_delivers_its_xid_events_once(tmp_path: Path) -> None:
    scenario = tmp_path / "nvml.json"
    gpus = [{"name": "NVIDIA H100 80GB HBM3", "memory_total_bytes": 80 * GIB}]
    scenario.write_text(json.dumps({"gpus": gpus}))
    backend = NvmlBackend(nvml=MockNvml.from_file(scenario), recover_after_seconds=60)
    try:
        tmp = scenario.with_suffix(".tmp")
        tmp.write_text(json.dumps({"gpus": gpus, "events": [{"gpu": 0, "xid": 79}]}))
        os.replace(tmp, scenario)
        backend.memory_used()  # any call follows the file
        wait_for(lambda: bool(backend.failed()))
        assert [f.xid for f in backend.take_failures()] == [79]
        for _ in range(3):
            backend.memory_used()
        assert backend.take_failures() == []
    finally:
        backend.close()
