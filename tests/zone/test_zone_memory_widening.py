"""A rigid job reclaimed for GPU memory retries asking the peak its agent saw: one decision
of the router's core (``widened_for_memory``, taken in ``ZoneCore.evaluate``), which
``sim replay --mode`` takes too (its memory kills are reported the same way)."""

from __future__ import annotations

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_zone.core import Member, Place, ZoneCore, widened_for_memory
from laminar_zone.entry import Entry
from laminar_zone.placement import ShapeCap
from laminar_zone.view import ZoneView

GIB = 1024**3
NOW = 1_000.0
SMALL = Demand(mig_profile="1g.10gb", gpu_memory_bytes=6 * GIB)


def test_a_peak_within_the_declared_memory_widens_nothing() -> None:
    assert widened_for_memory(SMALL, 6 * GIB, lambda p: True) is None
    assert widened_for_memory(SMALL, 0, lambda p: True) is None


def test_a_mig_need_moves_to_the_smallest_profile_that_holds_the_peak_and_is_there() -> None:
    everywhere = widened_for_memory(SMALL, 15 * GIB, lambda p: True)
    # 1g.20gb and 2g.20gb hold 15 GiB alike; by memory, then name.
    assert everywhere == Demand(mig_profile="1g.20gb", gpu_memory_bytes=15 * GIB)
    no_1g20 = widened_for_memory(SMALL, 15 * GIB, lambda p: p != "1g.20gb")
    assert no_1g20 == Demand(mig_profile="2g.20gb", gpu_memory_bytes=15 * GIB)
    only_big = widened_for_memory(SMALL, 15 * GIB, lambda p: p == "7g.80gb")
    assert only_big == Demand(mig_profile="7g.80gb", gpu_memory_bytes=15 * GIB)
    # Past every profile the zone has: it retries as it was.
    assert widened_for_memory(SMALL, 90 * GIB, lambda p: True) is None
    assert widened_for_memory(SMALL, 15 * GIB, lambda p: p == "1g.10gb") is None


def test_a_whole_gpu_need_raises_its_declared_memory() -> None:
    need = Demand(gpus=1, gpu_memory_bytes=20 * GIB)
    assert widened_for_memory(need, 30 * GIB, lambda p: False) == Demand(
        gpus=1, gpu_memory_bytes=30 * GIB
    )


def _core(shapes: dict[str, int]) -> ZoneCore:
    view = ZoneView(stale_after_seconds=3.0)
    for i in range(2):
        view.update(
            f"a{i}",
            f"127.0.0.1:{i + 1}",
            {f"mig:{p}": ShapeCap(n, n, 0, 80 * GIB) for p, n in shapes.items()},
            heat=0,
            draining=False,
            now=0.0,
        )
    return ZoneCore(view, {})


def _running_gang(core: ZoneCore, gang: int) -> Entry:
    job = zone_pb2.Job(
        job_id="j-1",
        spec=zone_pb2.JobSpec(
            command=["true"],
            resources=common_pb2.Resources(mig_profile="1g.10gb", gpu_memory_bytes=6 * GIB),
            gang_size=gang,
            max_retries=3,
        ),
        state=zone_pb2.PENDING,
        submitted_unix=NOW,
        attempts=1,
    )
    entry = Entry(job=job, need=SMALL)
    core.admit(entry)
    core.begin_commit(entry, [Member(f"a{m % 2}", "addr", (f"s{m}",)) for m in range(gang)])
    for p in entry.current():
        p.state = common_pb2.RUNNING
        p.reason = "running"  # the agent answered the commit
    core.committed(entry, [None] * gang, NOW)
    return entry


def _reclaimed(p: zone_pb2.Placement, peak: int) -> None:
    p.state = common_pb2.KILLED
    p.end_cause = EndCause.RECLAIMED.wire
    p.peak_gpu_memory_bytes = peak


def test_a_gang_reclaimed_for_memory_retries_on_a_profile_that_holds_the_peak() -> None:
    # Two hosts with one 1g.20gb each and two 3g.40gb each: a gang of three fits 3g.40gb only.
    core = _core({"1g.10gb": 7, "1g.20gb": 1, "3g.40gb": 2})
    entry = _running_gang(core, gang=3)
    _reclaimed(entry.current()[0], 15 * GIB)
    out = core.evaluate(entry, NOW)
    assert Place(entry) in out and entry.job.attempts == 2 and entry.job.retries_used == 1
    assert entry.need == Demand(mig_profile="3g.40gb", gpu_memory_bytes=15 * GIB)
    assert entry.item.need == entry.need  # the retry waits and is placed as it asks now
    resources = entry.job.spec.resources  # and the journaled record says so
    assert (resources.mig_profile, resources.gpu_memory_bytes) == ("3g.40gb", 15 * GIB)


def test_a_member_that_failed_past_its_declaration_retries_asking_its_peak() -> None:
    # A CUDA OOM is the job's own exit: the peak its agent saw says what it needs.
    core = _core({"1g.10gb": 7, "3g.40gb": 2})
    entry = _running_gang(core, gang=1)
    first = entry.current()[0]
    first.state = common_pb2.FAILED
    first.end_cause = EndCause.EXITED.wire
    first.peak_gpu_memory_bytes = 15 * GIB
    assert Place(entry) in core.evaluate(entry, NOW)
    assert entry.need == Demand(mig_profile="3g.40gb", gpu_memory_bytes=15 * GIB)


def test_a_member_that_failed_within_its_declaration_retries_as_it_was() -> None:
    core = _core({"1g.10gb": 7, "3g.40gb": 2})
    entry = _running_gang(core, gang=1)
    first = entry.current()[0]
    first.state = common_pb2.FAILED
    first.end_cause = EndCause.EXITED.wire
    first.peak_gpu_memory_bytes = 5 * GIB
    assert Place(entry) in core.evaluate(entry, NOW)
    assert entry.need == SMALL and entry.job.spec.resources.mig_profile == "1g.10gb"


def test_a_member_preempted_for_other_work_retries_as_it_was() -> None:
    core = _core({"1g.10gb": 7, "3g.40gb": 2})
    entry = _running_gang(core, gang=2)
    first = entry.current()[0]
    first.state = common_pb2.KILLED
    first.end_cause = EndCause.PREEMPTED.wire
    first.peak_gpu_memory_bytes = 15 * GIB
    core.evaluate(entry, NOW)
    assert entry.need == SMALL
