"""Decisions the router's driver used to make itself, now the core's, with no sockets, no
journal and no ZoneState: whether a new job is work or an array's record
(ZoneCore.admit_new), which journaled agents a restarted router lists
(ZoneCore.recalled_agents), and what the gauges count (ZoneCore.census)."""

from __future__ import annotations

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_zone.core import KNOWN_AGENT_SECONDS, NewJob, ZoneCore
from laminar_zone.entry import Entry
from laminar_zone.placement import ShapeCap
from laminar_zone.view import AgentStatus, ZoneView

NOW = 1_700_000_000.0
ONE_GPU = Demand(gpus=1)


def _view() -> ZoneView:
    view = ZoneView(stale_after_seconds=3.0)
    for i, agent_id in enumerate(("a0", "a1", "a2")):
        view.update(
            agent_id,
            f"127.0.0.1:{i + 1}",
            {"gpu:H100-80GB": ShapeCap(1, 1, 0, 80 << 30)},
            heat=0,
            draining=agent_id == "a2",
            now=0.0,
            total_gpus=1,
        )
    return view


def _spec(array: str = "") -> zone_pb2.JobSpec:
    return zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1), array=array)


def test_an_arrays_record_is_kept_as_progress_and_its_elements_are_the_work() -> None:
    core = ZoneCore(_view(), {})
    record, *elements = core.new_entries(_spec("0-2%2"), ONE_GPU, NewJob("j-a", "z1"), NOW, 0.0)
    assert core.admit_new(record, NOW) is False
    assert "j-a" not in core.entries and core.arrays["j-a"].total == 3
    assert core.arrays["j-a"].limit == 2
    # Summed up at once: nothing ended, nothing under way yet.
    assert record.job.array.total == 3 and record.job.state == zone_pb2.QUEUED
    assert [core.admit_new(e, NOW) for e in elements] == [True, True, True]
    assert sorted(core.entries) == [e.job.job_id for e in elements]


def test_a_plain_job_is_live_work_once_admitted() -> None:
    core = ZoneCore(_view(), {})
    (entry,) = core.new_entries(_spec(), ONE_GPU, NewJob("j-b", "z1"), NOW, 0.0)
    assert core.admit_new(entry, NOW) is True
    assert core.entries == {"j-b": entry} and core.arrays == {}


def test_a_restart_lists_agents_heard_from_lately_as_stale_and_leaves_the_rest_out() -> None:
    core = ZoneCore(ZoneView(stale_after_seconds=3.0), {})
    known = {
        "recent": ("10.0.0.1:7000", NOW - 60.0),
        "idle-a-day": ("10.0.0.2:7000", NOW - KNOWN_AGENT_SECONDS + 1.0),
        "gone": ("10.0.0.3:7000", NOW - KNOWN_AGENT_SECONDS - 1.0),
    }
    assert core.recalled_agents(known, NOW, 5.0) == ["recent", "idle-a-day"]
    agents = core.view.agents
    assert sorted(agents) == ["idle-a-day", "recent"]
    assert agents["recent"].address == "10.0.0.1:7000"
    assert all(r.status is AgentStatus.STALE and r.last_heartbeat == 5.0 for r in agents.values())


def test_the_census_counts_every_gauged_label_and_queued_jobs_by_class() -> None:
    core = ZoneCore(_view(), {})

    def job(
        job_id: str,
        state: zone_pb2.JobState,
        priority: common_pb2.PriorityClass = common_pb2.PRIORITY_CLASS_UNSPECIFIED,
    ) -> None:
        spec = _spec()
        spec.priority = priority
        job = zone_pb2.Job(job_id=job_id, spec=spec, state=state)
        core.admit(Entry(job=job, need=ONE_GPU, submitted_mono=0.0))

    job("q1", zone_pb2.QUEUED)  # no class: batch
    job("q2", zone_pb2.QUEUED, common_pb2.CRITICAL)
    job("q3", zone_pb2.QUEUED, common_pb2.BATCH)
    job("r1", zone_pb2.JOB_RUNNING)
    job("d1", zone_pb2.JOB_SUCCEEDED)  # not gauged
    core.view.agents["a1"].is_stale = True
    census = core.census()
    assert census.jobs == {
        "pending": 0,
        "queued": 3,
        "waiting": 0,
        "job_running": 1,
        "job_suspended": 0,
    }
    assert census.queued == {"critical": 1, "production": 0, "batch": 2, "opportunistic": 0}
    assert census.agents == {"ready": 1, "stale": 1, "draining": 1}
