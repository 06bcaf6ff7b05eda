"""The glue every simulated router shares (laminar_sim.zone_driver): what a simulated agent
reports, how a commit is taken, how the core's instructions are carried out."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import pytest

from laminar_agent.core import FAILED, EndDecision
from laminar_agent.ledger import Granted
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_sim.laminar import LEASE_TTL_SECONDS, Ask, SimHost, SimZone
from laminar_sim.load import LaminarRun, LoadSpec, Outcome, make_tasks
from laminar_sim.zone_driver import CoreHands, commit_on, end_on, start_on, submit
from laminar_zone.core import Failure, Loop, NewJob, Terminate, Wake
from laminar_zone.entry import Entry
from laminar_zone.lifecycle import rigid_subjob_id
from laminar_zone.view import ZoneView


def granted(host: SimHost, gpus: int, now: float) -> str:
    reply = host.probe(Ask(Demand(gpus=gpus)), now)
    assert isinstance(reply, Granted)
    return reply.lease.lease_id


def placement_on(host: SimHost, job_id: str = "j1") -> zone_pb2.Placement:
    return zone_pb2.Placement(subjob_id=rigid_subjob_id(job_id, 1, 0), agent_id=host.agent_id)


def test_an_ended_subjob_is_reported_as_the_agent_reports_it() -> None:
    """The end carries what the daemon's agent sends: the slices held, start, end, run
    time, exit code, cause and GPU memory peak; the capacity is back, and a second end of
    the same subjob reports nothing."""
    host = SimHost("h0", "V100", 2, 10**6, 10**6)
    lease_id = granted(host, 2, 10.0)
    placement = placement_on(host)
    reply = start_on(host, lease_id, placement, ("gpu0", "gpu1"), 10.0)
    assert reply.state == common_pb2.RUNNING and list(reply.slice_ids) == ["gpu0", "gpu1"]
    assert not isinstance(host.probe(Ask(Demand(gpus=1)), 11.0), Granted)  # both GPUs held
    decision = EndDecision(FAILED, EndCause.EXITED, "exited 1")
    end = end_on(
        host,
        placement.subjob_id,
        decision,
        25.0,
        started_unix=10.0,
        exit_code=1,
        peak_gpu_memory_bytes=123,
    )
    assert end is not None
    assert end.spec.subjob_id == placement.subjob_id and end.spec.job_id == "j1"
    assert end.agent_id == "h0" and sorted(end.slice_ids) == ["gpu0", "gpu1"]
    assert (end.state, end.end_cause, end.exit_code) == (
        common_pb2.FAILED,
        EndCause.EXITED.wire,
        1,
    )
    assert (end.started_unix, end.ended_unix, end.run_seconds) == (10.0, 25.0, 15.0)
    assert end.peak_gpu_memory_bytes == 123 and end.reason == "exited 1"
    assert host.core.subjob(placement.subjob_id) is None
    assert isinstance(host.probe(Ask(Demand(gpus=2)), 26.0), Granted)  # its GPUs are free
    assert end_on(host, placement.subjob_id, decision, 30.0, started_unix=10.0, exit_code=1) is None


def test_a_commit_of_a_lapsed_lease_is_refused_and_starts_nothing() -> None:
    host = SimHost("h0", "V100", 1, 10**6, 10**6)
    lease_id = granted(host, 1, 0.0)
    placement = placement_on(host)
    refused = commit_on(
        host, lease_id, placement, partial(start_on, now=LEASE_TTL_SECONDS), LEASE_TTL_SECONDS
    )
    assert refused == Failure("lease expired before the commit", unknown=False)
    assert host.core.subjob(placement.subjob_id) is None
    fresh = granted(host, 1, 10.0)
    taken = commit_on(host, fresh, placement, partial(start_on, now=11.0), 11.0)
    assert isinstance(taken, common_pb2.Subjob) and taken.started_unix == 11.0
    assert host.core.subjob(placement.subjob_id) is not None


def test_the_hands_carry_out_what_the_simulator_gave_and_refuse_the_rest() -> None:
    """A submit routes and kicks the job (a Place for the simulator's hand); a cancel's
    journal lets the ended job leave the core's memory; a wake of a loop the simulator
    has not is nothing; an instruction it has no hand for cannot occur there: an error
    naming the simulator."""
    host = SimHost("h0", "V100", 1, 10**6, 10**6)
    zone = SimZone("z0", {"h0": host}, ZoneView(1e18))
    zone.note(host)
    places: list[tuple[Entry, bool]] = []
    wakes: list[None] = []
    hands = CoreHands(
        zone.core,
        "sim test",
        place=lambda entry, from_queue: places.append((entry, from_queue)),
        wake=lambda: wakes.append(None),
    )
    spec = zone_pb2.JobSpec(
        command=["x"], tenant="t", resources=common_pb2.Resources(gpus=1), priority=common_pb2.BATCH
    )
    entry = submit(zone.core, spec, Demand(gpus=1), NewJob("j1", "z0"), 0.0, hands.carry_out)
    assert places == [(entry, False)] and "j1" in zone.core.entries
    hands.carry_out(zone.core.cancel(entry.job, "not wanted", 1.0))
    assert entry.job.state == zone_pb2.JOB_CANCELLED and "j1" not in zone.core.entries
    wakes.clear()
    hands.carry_out([Wake(Loop.MARKET)])
    assert wakes == []
    hands.carry_out([Wake(Loop.QUEUE)])
    assert len(wakes) == 1
    stop = Terminate(placement_on(host), "why", EndCause.TERMINATED)
    with pytest.raises(AssertionError, match="not carried out by sim test"):
        hands.carry_out([stop])


@dataclass
class LossyRun:
    """What a lossy run came to, and the calls it recorded."""

    out: Outcome
    calls: list[tuple[Any, ...]]


def run_lossy(hosts: int, zone_hosts: int, loss: float, seed: int, method: str) -> LossyRun:
    """``sim load``'s Laminar routers with lost messages, recording the arguments of each
    call of their ``method`` (confirm, forward) on the way."""
    spec = LoadSpec(
        hosts=hosts,
        load=0.8,
        seed=seed,
        window_seconds=3.0,
        warmup_seconds=0.0,
        zone_hosts=zone_hosts,
        loss_ratio=loss,
        probes_per_attempt=2,
        policies=("laminar",),
    )
    tasks = make_tasks(spec)
    run = LaminarRun(spec, tasks)
    seen: list[tuple[Any, ...]] = []
    inner = getattr(run, method)

    def recording(*args: Any) -> None:
        seen.append(args)
        inner(*args)

    setattr(run, method, recording)
    out = run.run(None, "laminar")
    # Every task started once or dropped at its deadline, and the run ended.
    assert run.done == {t.index for t in tasks}
    assert out.started + out.dropped == len(tasks) and out.placements == out.started
    return LossyRun(out, seen)


def test_sim_load_asks_the_agent_about_a_lost_commit_at_its_next_heartbeat() -> None:
    """With messages lost, a commit whose reply is lost is confirmed at the agent's next
    heartbeat (zone_driver.confirm_on): the core learns whether it runs, and every task
    is started at most once or dropped."""
    lossy = run_lossy(hosts=4, zone_hosts=4, loss=0.2, seed=5, method="confirm")
    assert lossy.calls  # some commit's outcome was unknown and asked about
    assert lossy.out.started > 0


def test_sim_load_with_lost_messages_and_several_zones_ends_with_every_task_counted() -> None:
    """A forward lost on the way is sent again (as the router retries ForwardJob until its
    peer answers): every task is started once or dropped at its deadline, and the run ends
    (a lost forward used to leave its task neither, and the run never ended)."""
    lossy = run_lossy(hosts=100, zone_hosts=25, loss=0.05, seed=1, method="forward")
    forwarded = [task.index for _, _, task in lossy.calls]
    assert len(forwarded) > len(set(forwarded))  # some forward was lost and sent again
