"""Fake backend: spec parsing, uuids, memory accounting and injection expiry."""

from __future__ import annotations

from pathlib import Path

import pytest

from laminar_agent.inventory import open_backend
from laminar_agent.inventory.fake import FakeGpuBackend, FakeGpuSpec, parse_fake_spec
from laminar_base.errors import InvalidArgument, NotFound

GIB = 1024**3


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_parse_examples() -> None:
    assert parse_fake_spec("4xH100-80GB") == [FakeGpuSpec("H100-80GB", 4, 80 * GIB, (), False)]
    assert parse_fake_spec("H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb, a100-40gb") == [
        FakeGpuSpec("H100-80GB", 1, 80 * GIB, ("3g.40gb", "2g.20gb", "1g.10gb"), False),
        FakeGpuSpec("A100-40GB", 1, 40 * GIB, (), False),
    ]
    assert parse_fake_spec("2 x A100-80GB:shared") == [
        FakeGpuSpec("A100-80GB", 2, 80 * GIB, (), True)
    ]
    assert parse_fake_spec("H200-141GB")[0].memory_total_bytes == 141 * GIB


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        ("", "empty item"),
        ("H100-80GB,,T4-16GB", "empty item"),
        ("B200-192GB", "unknown model"),
        ("0xH100-80GB", "count"),
        ("65xT4-16GB", "count"),
        ("40xT4-16GB,40xL4-24GB", "more than 64"),
        ("4x", "unknown model"),
        ("H100 80GB", "cannot parse"),
        ("H100-80GB:turbo", "unknown option"),
        ("H100-80GB:mig=", "empty MIG profile"),
        ("H100-80GB:mig=9g.90gb", "unknown MIG profile"),
        ("L4-24GB:mig=1g.10gb", "does not support MIG"),
        ("H100-80GB:mig=4g.40gb+4g.40gb", "does not fit"),
        ("H100-80GB:mig=3g.40gb:shared", "cannot also be shared"),
    ],
)
def test_parse_rejects_bad_specs_naming_the_field(spec: str, reason: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_fake_spec(spec)
    assert info.value.field == "fake_gpus"
    assert reason in str(info.value)


def test_topology_and_deterministic_uuids() -> None:
    spec = "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb,2xA100-80GB:shared,T4-16GB"
    first = FakeGpuBackend(spec, agent_id="agent-a").gpus()
    again = FakeGpuBackend(spec, agent_id="agent-a").gpus()
    other = FakeGpuBackend(spec, agent_id="agent-b").gpus()
    assert first == again
    assert [g.index for g in first] == [0, 1, 2, 3]
    assert [g.shared for g in first] == [False, True, True, False]
    mig_gpu = first[0]
    assert mig_gpu.mig_enabled
    assert [(m.profile, m.start, m.size) for m in mig_gpu.mig_instances] == [
        ("3g.40gb", 0, 4),
        ("2g.20gb", 4, 2),
        ("1g.10gb", 6, 1),
    ]
    assert mig_gpu.mig_instances[0].memory_total_bytes == 40 * GIB
    all_uuids = [g.uuid for g in first] + [m.uuid for m in mig_gpu.mig_instances]
    assert len(set(all_uuids)) == len(all_uuids)
    assert all(g.uuid.startswith("GPU-") and len(g.uuid) == 40 for g in first)
    assert all(m.uuid.startswith("MIG-") for m in mig_gpu.mig_instances)
    other_uuids = {g.uuid for g in other} | {m.uuid for m in other[0].mig_instances}
    assert not other_uuids & set(all_uuids)


def test_memory_accounting_with_subjobs_and_usage_file(tmp_path: Path) -> None:
    backend = FakeGpuBackend("H100-80GB:mig=3g.40gb+3g.40gb,2xL4-24GB", agent_id="a")
    mig_gpu, l4_a, l4_b = backend.gpus()
    mig0, mig1 = mig_gpu.mig_instances
    usage = tmp_path / "gpu_mem"
    backend.attach_subjob("s1", [mig0.uuid], 5 * GIB, usage)  # file missing -> declared
    backend.attach_subjob("s2", [l4_a.uuid, l4_b.uuid], 2 * GIB, None)
    used = backend.memory_used()
    assert set(used) == {mig_gpu.uuid, mig0.uuid, mig1.uuid, l4_a.uuid, l4_b.uuid}
    assert used[mig0.uuid] == (5 * GIB, 40 * GIB)
    assert used[mig1.uuid] == (0, 40 * GIB)
    assert used[mig_gpu.uuid] == (5 * GIB, 80 * GIB)
    assert used[l4_a.uuid] == used[l4_b.uuid] == (2 * GIB, 24 * GIB)

    usage.write_text("1234567\n")  # the subjob replays its real curve
    assert backend.memory_used()[mig0.uuid][0] == 1234567
    usage.write_text("garbage")  # unparsable -> declared
    assert backend.memory_used()[mig0.uuid][0] == 5 * GIB
    usage.write_text(str(100 * GIB))  # over the instance size: clamped like real hardware
    assert backend.memory_used()[mig0.uuid] == (40 * GIB, 40 * GIB)
    assert backend.memory_used()[mig_gpu.uuid][0] == 40 * GIB

    backend.detach_subjob("s1")
    backend.detach_subjob("s1")  # idempotent
    assert backend.memory_used()[mig_gpu.uuid] == (0, 80 * GIB)


def test_attach_validates_arguments() -> None:
    backend = FakeGpuBackend("T4-16GB", agent_id="a")
    gpu_uuid = backend.gpus()[0].uuid
    with pytest.raises(NotFound) as nf:
        backend.attach_subjob("s", ["GPU-nope"], 1, None)
    assert nf.value.field == "device_uuids"
    with pytest.raises(InvalidArgument) as ia:
        backend.attach_subjob("s", [], 1, None)
    assert ia.value.field == "device_uuids"
    with pytest.raises(InvalidArgument) as neg:
        backend.attach_subjob("s", [gpu_uuid], -1, None)
    assert neg.value.field == "declared_bytes"


def test_injection_add_replace_and_expiry() -> None:
    clock = FakeClock()
    backend = FakeGpuBackend("H100-80GB:mig=4g.40gb+3g.40gb", agent_id="a", clock=clock)
    gpu = backend.gpus()[0]
    mig = gpu.mig_instances[1]
    assert (
        backend.inject(
            gpu_index=0, device_uuid=mig.uuid, used_bytes=3 * GIB, add=False, duration_seconds=10
        )
        == 3 * GIB
    )
    assert (
        backend.inject(
            gpu_index=0, device_uuid=mig.uuid, used_bytes=1 * GIB, add=True, duration_seconds=0
        )
        == 4 * GIB
    )
    assert (
        backend.inject(
            gpu_index=0, device_uuid=None, used_bytes=2 * GIB, add=False, duration_seconds=5
        )
        == 2 * GIB
    )
    used = backend.memory_used()
    assert used[mig.uuid][0] == 4 * GIB
    assert used[gpu.uuid][0] == 6 * GIB  # own 2 + instance 4

    clock.now += 5  # GPU-level injection expires exactly at its deadline
    used = backend.memory_used()
    assert used[gpu.uuid][0] == 4 * GIB
    clock.now += 5  # the 3 GiB one expires, the unlimited one stays
    assert backend.memory_used()[mig.uuid][0] == 1 * GIB
    assert (
        backend.inject(
            gpu_index=0, device_uuid=mig.uuid, used_bytes=0, add=False, duration_seconds=0
        )
        == 0
    )
    assert backend.memory_used()[gpu.uuid][0] == 0


def test_injection_validates_fields() -> None:
    backend = FakeGpuBackend("2xT4-16GB", agent_id="a")
    other = backend.gpus()[1].uuid
    cases: list[tuple[dict[str, object], type[Exception], str]] = [
        ({"gpu_index": -1}, InvalidArgument, "gpu_index"),
        ({"gpu_index": 2}, NotFound, "gpu_index"),
        ({"device_uuid": other}, NotFound, "device_uuid"),
        ({"used_bytes": -5}, InvalidArgument, "used_bytes"),
        ({"duration_seconds": -1.0}, InvalidArgument, "duration_seconds"),
        ({"duration_seconds": float("nan")}, InvalidArgument, "duration_seconds"),
    ]
    for override, error, field in cases:
        kwargs: dict[str, object] = {
            "gpu_index": 0,
            "device_uuid": None,
            "used_bytes": 1,
            "add": False,
            "duration_seconds": 0.0,
        }
        kwargs.update(override)
        with pytest.raises(error) as info:
            backend.inject(**kwargs)  # type: ignore[arg-type]
        assert getattr(info.value, "field", None) == field


def test_open_backend_fake_and_bad_name() -> None:
    backend = open_backend("fake", fake_spec="3xL4-24GB", agent_id="x", shared_gpus="0,2")
    assert backend.name == "fake"
    assert [g.shared for g in backend.gpus()] == [True, False, True]
    every = open_backend("fake", fake_spec="2xL4-24GB", agent_id="x", shared_gpus="all")
    assert all(g.shared for g in every.gpus())
    with pytest.raises(InvalidArgument) as info:
        open_backend("cuda", fake_spec="", agent_id="x")
    assert info.value.field == "gpu_backend"
    with pytest.raises(InvalidArgument) as bad_shared:
        open_backend("fake", fake_spec="L4-24GB", agent_id="x", shared_gpus="first")
    assert bad_shared.value.field == "shared_gpus"
