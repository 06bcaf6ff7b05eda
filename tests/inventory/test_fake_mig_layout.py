"""The fake backend's MIG layout changes: new instances where asked, refused while in use."""

from __future__ import annotations

import pytest

from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_base.errors import FailedPrecondition, InvalidArgument


def test_a_layout_replaces_the_instances_and_keeps_those_that_stay() -> None:
    backend = FakeGpuBackend("H100-80GB:mig=3g.40gb+3g.40gb", agent_id="a")
    before = {(m.profile, m.start): m.uuid for m in backend.gpus()[0].mig_instances}
    instances = backend.apply_mig_layout(0, [("3g.40gb", 0, 4), ("1g.10gb", 4, 1)])
    assert [(m.profile, m.start) for m in instances] == [("3g.40gb", 0), ("1g.10gb", 4)]
    assert instances[0].uuid == before[("3g.40gb", 0)]
    assert instances[1].uuid not in before.values()
    assert backend.gpus()[0].mig_instances == instances
    # Memory is reported for the new instance, not for the one it replaced.
    assert set(backend.memory_used()) >= {m.uuid for m in instances}
    assert before[("3g.40gb", 4)] not in backend.memory_used()


def test_a_gpu_in_use_or_an_illegal_layout_is_refused() -> None:
    backend = FakeGpuBackend("H100-80GB:mig=3g.40gb+3g.40gb,H100-80GB", agent_id="a")
    used = backend.gpus()[0].mig_instances[1].uuid
    backend.attach_subjob("s1", [used], 0, None)
    with pytest.raises(FailedPrecondition, match="runs s1"):
        backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    with pytest.raises(FailedPrecondition, match="not a MIG GPU"):
        backend.apply_mig_layout(1, [("7g.80gb", 0, 8)])
    backend.detach_subjob("s1")
    with pytest.raises(InvalidArgument):
        backend.apply_mig_layout(0, [("4g.40gb", 0, 4), ("4g.40gb", 4, 4)])
    assert len(backend.gpus()[0].mig_instances) == 2


def test_a_busy_gpu_may_change_its_idle_part_and_the_busy_instance_is_untouched() -> None:
    backend = FakeGpuBackend("H100-80GB:mig=3g.40gb+1g.10gb+1g.10gb", agent_id="a")
    busy = backend.gpus()[0].mig_instances[0]
    backend.attach_subjob("s1", [busy.uuid], 0, None)
    # The two idle 1g instances (starts 4, 5) give way to a 3g at 4; the 3g at 0 runs on.
    instances = backend.apply_mig_layout(0, [("3g.40gb", 0, 4), ("3g.40gb", 4, 4)])
    assert [(m.profile, m.start) for m in instances] == [("3g.40gb", 0), ("3g.40gb", 4)]
    assert instances[0] == busy
    # A layout that drops the busy instance is refused, and nothing changes.
    with pytest.raises(FailedPrecondition, match="runs s1 on an instance"):
        backend.apply_mig_layout(0, [("7g.80gb", 0, 8)])
    assert backend.gpus()[0].mig_instances == instances
