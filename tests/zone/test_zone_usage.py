"""Usage accounting without sockets: the pure row arithmetic, then the SQLite ledger.

The ledger tests use a real journal file (``JobStore``) and an injected registry, so
idempotency is checked where it lives: the primary key and what the counters saw.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.causes import EndCause
from laminar_base.demand import Demand
from laminar_zone.metrics import MAX_TENANT_LABELS, OTHER_TENANT, ZoneMetrics
from laminar_zone.store import JobStore
from laminar_zone.usage import SubjobUsage, UsageLedger, slice_kind, usage_of
from laminar_zone.view import AgentRecord, ShapeCap

GIB = 1 << 30
T0 = 1_800_000_000.0


def placement(
    subjob_id: str = "j-1-a1-m0",
    *,
    state: int = common_pb2.SUCCEEDED,
    started: float = T0,
    ended: float = T0 + 100.0,
    run: float = 100.0,
    reason: str = "",
    cause: EndCause = EndCause.UNSPECIFIED,
    peak: int = 0,
    agent: str = "h1",
) -> zone_pb2.Placement:
    return zone_pb2.Placement(
        subjob_id=subjob_id,
        agent_id=agent,
        state=state,  # type: ignore[arg-type]
        started_unix=started,
        ended_unix=ended,
        run_seconds=run,
        reason=reason,
        end_cause=cause.wire,
        peak_gpu_memory_bytes=peak,
    )


def one(p: zone_pb2.Placement, need: Demand | None = None, now: float = T0 + 1000) -> SubjobUsage:
    usage = usage_of(
        p,
        job_id="j-1",
        tenant="alice",
        need=need or Demand(gpus=1, gpu_memory_bytes=10 * GIB),
        kind="gpu:H100-80GB",
        now_unix=now,
    )
    assert usage is not None
    return usage


# ---------------------------------------------------------------- slice kinds


def test_slice_kind_names_the_model_asked_for_else_the_agents_only_model() -> None:
    h100 = ["gpu:H100-80GB", "mig:3g.40gb"]
    assert slice_kind(Demand(gpus=1), h100) == "gpu:H100-80GB"
    assert slice_kind(Demand(gpus=1, gpu_model="A100-80GB"), h100) == "gpu:A100-80GB"
    assert slice_kind(Demand(gpus=1), ["gpu:H100-80GB", "gpu:A100-80GB"]) == "gpu:any"
    assert slice_kind(Demand(gpus=1), []) == "gpu:any"  # agent unknown (gone)
    assert slice_kind(Demand(mig_profile="3g.40gb"), h100) == "mig:3g.40gb"
    assert slice_kind(Demand(gpu_milli=250), ["share:A100-80GB"]) == "share:A100-80GB"
    assert slice_kind(Demand(gpu_milli=250), h100) == "share:any"
    assert slice_kind(Demand(), h100) == "cpu"


# ---------------------------------------------------------------- one row


def test_an_ended_subjob_counts_the_agents_run_time_and_declared_memory() -> None:
    usage = one(placement(ended=T0 + 100.4, run=99.5), Demand(gpus=2, gpu_memory_bytes=10 * GIB))
    assert usage.run_seconds == pytest.approx(99.5)
    assert usage.ended_unix == T0 + 100.4
    figures = usage.clipped(0.0)
    assert figures.subjobs == 1
    assert figures.gpu_seconds == pytest.approx(2 * 99.5)
    assert figures.gpu_memory_byte_seconds == pytest.approx(20 * GIB * 99.5)
    assert figures.lost_gpu_seconds == 0.0


def test_observed_peak_memory_replaces_the_declaration() -> None:
    usage = one(placement(peak=3 * GIB))
    assert usage.memory_bytes == 3 * GIB
    assert usage.clipped(0.0).gpu_memory_byte_seconds == pytest.approx(3 * GIB * 100.0)


def test_mig_and_share_slices_count_gpu_equivalents() -> None:
    mig = one(placement(), Demand(mig_profile="3g.40gb"))
    assert mig.clipped(0.0).gpu_seconds == pytest.approx(100.0 * 3 / 7)
    share = one(placement(), Demand(gpu_milli=250))
    assert share.clipped(0.0).gpu_seconds == pytest.approx(25.0)


def test_a_subjob_that_never_started_has_no_row() -> None:
    never = placement(state=common_pb2.FAILED, started=0.0, ended=T0, run=0.0)
    usage = usage_of(
        never, job_id="j", tenant="t", need=Demand(gpus=1), kind="gpu:any", now_unix=T0
    )
    assert usage is None


def test_a_running_subjob_counts_up_to_now() -> None:
    usage = one(placement(state=common_pb2.RUNNING, ended=0.0, run=0.0), now=T0 + 42.0)
    assert usage.started_unix == T0
    assert usage.clipped(0.0).gpu_seconds == pytest.approx(42.0)
    assert usage.clipped(0.0).lost_gpu_seconds == 0.0


def test_router_ended_subjob_without_run_time_uses_the_wall_clock_interval() -> None:
    lost = placement(
        state=common_pb2.LOST,
        ended=T0 + 30.0,
        run=0.0,
        reason="agent h1 silent",
        cause=EndCause.LOST,
    )
    usage = one(lost)
    assert usage.clipped(0.0).gpu_seconds == pytest.approx(30.0)
    assert usage.clipped(0.0).lost_gpu_seconds == 0.0  # a dead host is not Airlock's doing


@pytest.mark.parametrize(
    ("cause", "reason"),
    [
        (EndCause.RECLAIMED, "airlock_reclaimed: gpu0 at 79.0 of 80.0 GiB"),
        (EndCause.PREEMPTED, "preempted: room for critical job j-9"),
        (EndCause.READDRESSED, "readdressed: moved to h2 after Airlock suspended it on h1"),
    ],
)
def test_airlock_losses_count_the_whole_run_without_checkpoint_info(
    cause: EndCause, reason: str
) -> None:
    usage = one(placement(state=common_pb2.KILLED, reason=reason, cause=cause), Demand(gpus=2))
    assert usage.clipped(0.0).lost_gpu_seconds == pytest.approx(2 * 100.0)


def test_airlock_loss_starts_at_the_last_checkpoint_when_known() -> None:
    reclaimed = placement(
        state=common_pb2.KILLED, reason="airlock_reclaimed: x", cause=EndCause.RECLAIMED
    )
    usage = usage_of(
        reclaimed,
        job_id="j",
        tenant="t",
        need=Demand(gpus=1),
        kind="gpu:any",
        now_unix=T0 + 1000,
        checkpoint_unix=T0 + 70.0,
    )
    assert usage is not None
    assert usage.clipped(0.0).lost_gpu_seconds == pytest.approx(30.0)
    assert usage.clipped(0.0).gpu_seconds == pytest.approx(100.0)


def test_failed_and_cancelled_subjobs_lose_nothing_to_airlock() -> None:
    failed = one(placement(state=common_pb2.FAILED, reason="exit code 1", cause=EndCause.EXITED))
    killed = one(
        placement(state=common_pb2.KILLED, reason="cancelled: by request", cause=EndCause.CANCELLED)
    )
    assert failed.clipped(0.0).lost_gpu_seconds == 0.0
    assert killed.clipped(0.0).lost_gpu_seconds == 0.0


# ---------------------------------------------------------------- clipping to since


def test_clipping_keeps_only_the_part_after_since() -> None:
    usage = one(
        placement(state=common_pb2.KILLED, reason="preempted: x", cause=EndCause.PREEMPTED),
        Demand(gpus=1),
    )
    assert usage.clipped(T0 - 5).gpu_seconds == pytest.approx(100.0)
    middle = usage.clipped(T0 + 25.0)
    assert middle.subjobs == 1
    assert middle.gpu_seconds == pytest.approx(75.0)
    assert middle.lost_gpu_seconds == pytest.approx(75.0)
    assert middle.gpu_memory_byte_seconds == pytest.approx(0.0)  # no memory declared
    gone = usage.clipped(T0 + 100.0)
    assert (gone.subjobs, gone.gpu_seconds, gone.lost_gpu_seconds) == (0, 0.0, 0.0)


def test_clipping_a_lost_tail_counts_only_the_lost_part_after_since() -> None:
    usage = SubjobUsage("s", "j", "t", "gpu:any", 1.0, 0, T0, T0 + 100.0, T0 + 80.0)
    assert usage.clipped(T0 + 50.0).lost_gpu_seconds == pytest.approx(20.0)
    assert usage.clipped(T0 + 90.0).lost_gpu_seconds == pytest.approx(10.0)
    assert usage.clipped(T0 + 90.0).gpu_seconds == pytest.approx(10.0)


# ---------------------------------------------------------------- the ledger


def job(
    job_id: str, tenant: str, *placements: zone_pb2.Placement, state: int = zone_pb2.JOB_SUCCEEDED
) -> zone_pb2.Job:
    return zone_pb2.Job(
        job_id=job_id,
        spec=zone_pb2.JobSpec(
            tenant=tenant,
            command=["true"],
            resources=common_pb2.Resources(gpus=1, gpu_memory_bytes=GIB),
        ),
        state=state,  # type: ignore[arg-type]
        placements=list(placements),
    )


def counter(metrics: ZoneMetrics, name: str, tenant: str, kind: str) -> float:
    value = metrics.registry.get_sample_value(name, {"tenant": tenant, "slice_kind": kind})
    return value or 0.0


def agents() -> dict[str, AgentRecord]:
    return {"h1": AgentRecord("h1", "127.0.0.1:1", shapes={"gpu:H100-80GB": ShapeCap(1, 1)})}


def ledger_at(path: Path, metrics: ZoneMetrics | None = None) -> tuple[UsageLedger, JobStore]:
    store = JobStore(path)
    return UsageLedger(store, metrics or ZoneMetrics(CollectorRegistry()), agents()), store


def test_an_event_seen_twice_and_a_restart_count_once(tmp_path: Path) -> None:
    metrics = ZoneMetrics(CollectorRegistry())
    ledger, store = ledger_at(tmp_path / "zone.db", metrics)
    j = job("j-1", "alice", placement("j-1-a1-m0"))
    assert ledger.record(j, T0 + 500) == 1
    assert ledger.record(j, T0 + 501) == 0  # a re-delivered heartbeat
    gpu_seconds = "laminar_zone_usage_gpu_seconds_total"
    assert counter(metrics, gpu_seconds, "alice", "gpu:H100-80GB") == pytest.approx(100.0)
    store.close()

    metrics2 = ZoneMetrics(CollectorRegistry())
    again, store = ledger_at(tmp_path / "zone.db", metrics2)  # a router restart
    assert again.record(j, T0 + 600) == 0
    assert counter(metrics2, gpu_seconds, "alice", "gpu:H100-80GB") == 0.0
    (row,) = again.report("", 0.0, [], T0 + 700)
    assert (row.tenant, row.slice_kind, row.subjobs) == ("alice", "gpu:H100-80GB", 1)
    assert row.gpu_seconds == pytest.approx(100.0)
    assert row.gpu_memory_byte_seconds == pytest.approx(GIB * 100.0)
    store.close()


def test_usage_rows_commit_with_the_job_or_not_at_all(tmp_path: Path) -> None:
    """A save writes the usage rows and the job in one transaction: when the job's write
    fails, the rows roll back with it and are neither counted nor taken as written, so
    the next save writes them (once)."""
    metrics = ZoneMetrics(CollectorRegistry())
    ledger, store = ledger_at(tmp_path / "zone.db", metrics)
    j = job("j-1", "alice", placement("j-1-a1-m0"))
    gpu_seconds = "laminar_zone_usage_gpu_seconds_total"
    with pytest.raises(RuntimeError), store.transaction():
        ledger.write([j], T0 + 500)
        store.put_many([j])
        raise RuntimeError("the disk is full")
    assert ledger.report("", 0.0, [], T0 + 700) == []
    assert store.get("j-1") is None
    assert counter(metrics, gpu_seconds, "alice", "gpu:H100-80GB") == 0.0
    with store.transaction():
        rows = ledger.write([j], T0 + 501)
        store.put_many([j])
    assert ledger.written(rows) == 1
    assert counter(metrics, gpu_seconds, "alice", "gpu:H100-80GB") == pytest.approx(100.0)
    assert store.get("j-1") is not None
    (row,) = ledger.report("", 0.0, [], T0 + 700)
    assert row.subjobs == 1
    assert ledger.record(j, T0 + 502) == 0  # written: not again
    store.close()


def test_report_groups_by_tenant_and_kind_filters_a_tenant_and_adds_running_subjobs(
    tmp_path: Path,
) -> None:
    ledger, store = ledger_at(tmp_path / "zone.db")
    ledger.record(job("j-1", "alice", placement("j-1-a1-m0")), T0 + 200)
    ledger.record(job("j-2", "alice", placement("j-2-a1-m0", run=50.0, ended=T0 + 50)), T0 + 200)
    ledger.record(job("j-3", "bob", placement("j-3-a1-m0", agent="gone")), T0 + 200)
    running = job(
        "j-4",
        "alice",
        placement("j-4-a1-m0", state=common_pb2.RUNNING, started=T0 + 150, ended=0, run=0),
        state=zone_pb2.JOB_RUNNING,
    )
    rows = ledger.report("", 0.0, [running], T0 + 200)
    got = {(r.tenant, r.slice_kind): (r.subjobs, round(r.gpu_seconds, 6)) for r in rows}
    assert got == {
        ("alice", "gpu:H100-80GB"): (3, 200.0),
        ("bob", "gpu:any"): (1, 100.0),
    }
    only_bob = ledger.report("bob", 0.0, [running], T0 + 200)
    assert [r.tenant for r in only_bob] == ["bob"]
    since = ledger.report("alice", T0 + 90, [running], T0 + 200)
    assert since[0].subjobs == 2  # j-2 ended before since
    assert since[0].gpu_seconds == pytest.approx(10.0 + 50.0)
    store.close()


def test_rows_of_jobs_journaled_before_the_table_existed_are_backfilled_once(
    tmp_path: Path,
) -> None:
    store = JobStore(tmp_path / "zone.db")
    store.put(job("j-old", "alice", placement("j-old-a1-m0")))
    store.close()
    ledger, store = ledger_at(tmp_path / "zone.db")
    (row,) = ledger.report("", 0.0, [], T0 + 200)
    assert (row.tenant, row.subjobs, row.slice_kind) == ("alice", 1, "gpu:H100-80GB")
    store.put(job("j-new", "alice", placement("j-new-a1-m0")))  # journaled, never recorded
    store.close()
    again, store = ledger_at(tmp_path / "zone.db")
    (row,) = again.report("", 0.0, [], T0 + 200)
    assert row.subjobs == 1  # backfill ran once, at the upgrade
    store.close()


def test_tenant_labels_are_bounded(tmp_path: Path) -> None:
    metrics = ZoneMetrics(CollectorRegistry())
    ledger, store = ledger_at(tmp_path / "zone.db", metrics)
    for i in range(MAX_TENANT_LABELS + 3):
        ledger.record(job(f"j-{i}", f"t{i}", placement(f"j-{i}-a1-m0")), T0 + 200)
    name = "laminar_zone_usage_gpu_seconds_total"
    assert counter(metrics, name, OTHER_TENANT, "gpu:H100-80GB") == pytest.approx(300.0)
    assert counter(metrics, name, "t0", "gpu:H100-80GB") == pytest.approx(100.0)
    store.close()


intervals = st.tuples(
    st.floats(min_value=0.0, max_value=1000.0),  # start offset
    st.floats(min_value=0.0, max_value=1000.0),  # run seconds
    st.floats(min_value=0.0, max_value=1.0),  # where the lost tail begins, as a fraction
    st.sampled_from([0.25, 3 / 7, 1.0, 2.0]),  # GPU units
)


@settings(max_examples=40, deadline=None)
@given(rows=st.lists(intervals, min_size=1, max_size=8), since=st.floats(0.0, 2500.0))
def test_the_sql_aggregate_clips_exactly_like_the_pure_arithmetic(
    tmp_path_factory: pytest.TempPathFactory,
    rows: list[tuple[float, float, float, float]],
    since: float,
) -> None:
    ledger, store = ledger_at(tmp_path_factory.mktemp("usage") / "zone.db")
    expected = 0.0, 0.0, 0.0
    usages = []
    for i, (offset, run, lost_at, units) in enumerate(rows):
        start = T0 + offset
        usage = SubjobUsage(
            f"s{i}", "j", "t", "gpu:any", units, GIB, start, start + run, start + lost_at * run
        )
        usages.append(usage)
        part = usage.clipped(T0 + since)
        expected = (
            expected[0] + part.gpu_seconds,
            expected[1] + part.gpu_memory_byte_seconds,
            expected[2] + part.lost_gpu_seconds,
        )
    ledger._insert(usages)
    got = ledger.report("", T0 + since, [], T0 + 5000)
    total = (
        sum(r.gpu_seconds for r in got),
        sum(r.gpu_memory_byte_seconds for r in got),
        sum(r.lost_gpu_seconds for r in got),
    )
    assert total == pytest.approx(expected, rel=1e-9, abs=1e-3)
    store.close()
