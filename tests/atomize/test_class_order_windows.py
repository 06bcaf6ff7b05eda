"""The windows a class's clearing round offers, built by one function for the router and the
simulator (laminar_zone.market.class_windows, issues 14 and 17): cut at the blocked rigid
heads of the class or a higher one only, held windows kept for their holder, slices taken
earlier in the pass left out, at most ``max_window_seconds``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.demand import Demand
from laminar_zone.atomizer import Atomizer
from laminar_zone.config import ZoneConfig
from laminar_zone.entry import Entry
from laminar_zone.market import MarketWindow, OpenSlice, class_windows, slice_family
from laminar_zone.queue import Clear, QueueItem, QueueWalk, class_order, drive
from laminar_zone.round import Start

GIB = 1 << 30
NOW = 1000.0
CAP = 3600.0
MIG40 = slice_family("3g.40gb")


def open_slice(
    slice_id: str, family: str = MIG40, end: float = 0.0, held_by: str = ""
) -> OpenSlice:
    return OpenSlice("a", slice_id, 40 * GIB, 428, family, end, "mig", held_by)


def lengths(windows: list[MarketWindow]) -> dict[str, float]:
    return {w.slice_id: w.length_seconds for w in windows}


def test_a_slice_is_offered_to_its_end_at_most_the_cap_and_never_past_its_familys_head() -> None:
    slices = [
        open_slice("open"),
        open_slice("ends", end=NOW + 60.0),
        open_slice("whole", family=slice_family("")),
        open_slice("over", end=NOW),  # no time left: not offered
    ]
    assert lengths(class_windows(NOW, slices, {}, CAP)) == {"open": CAP, "ends": 60.0, "whole": CAP}
    cut = class_windows(NOW, slices, {MIG40: NOW + 120.0}, CAP)
    # The head of the 3g.40gb family cuts its slices only; a whole GPU serves another family.
    assert lengths(cut) == {"open": 120.0, "ends": 60.0, "whole": CAP}
    # A head expected to start now (or already late) leaves its family's slices nothing.
    assert lengths(class_windows(NOW, slices, {MIG40: NOW}, CAP)) == {"whole": CAP}
    # A head whose start is unknown cuts nothing (it may never start).
    assert lengths(class_windows(NOW, slices, {MIG40: None}, CAP))["open"] == CAP
    assert lengths(class_windows(NOW, slices, {}, 30.0)) == {
        "open": 30.0,
        "ends": 30.0,
        "whole": 30.0,
    }


def test_held_windows_stay_their_holders_and_are_offered_to_the_next_commitment() -> None:
    # The piece's old window ended (its end is past): the slice is offered open-ended, as far
    # as the cap and the heads allow, and still marked as held by the piece's job.
    held = open_slice("held", end=NOW - 5.0, held_by="job-1")
    (window,) = class_windows(NOW, [held], {}, CAP)
    assert (window.held_by, window.length_seconds) == ("job-1", CAP)
    (cut,) = class_windows(NOW, [held], {MIG40: NOW + 90.0}, CAP)
    assert (cut.held_by, cut.length_seconds) == ("job-1", 90.0)
    assert window.alike != class_windows(NOW, [open_slice("free")], {}, CAP)[0].alike


def test_slices_taken_earlier_in_the_pass_are_not_offered() -> None:
    slices = [open_slice("s0"), open_slice("s1", held_by="job-1"), open_slice("s2")]
    taken = {("a", "s0"), ("a", "s1")}
    assert [w.slice_id for w in class_windows(NOW, slices, {}, CAP, taken)] == ["s2"]
    assert [w.slice_id for w in class_windows(NOW, slices, {}, CAP)] == ["s0", "s1", "s2"]


def test_a_blocked_batch_job_cuts_batch_and_opportunistic_windows_not_production() -> None:
    """The pass (class_order) hands each class the heads of its class and the higher ones:
    a blocked batch rigid job holds its slice against batch and opportunistic bids only."""
    blocked = QueueItem("rigid", common_pb2.BATCH, "t", 0.0, Demand(mig_profile="3g.40gb"), 1, 60)
    steps = class_order(
        QueueWalk(NOW),
        [blocked],
        lambda job: job,
        lambda job, ahead: NOW + 120.0,
        {common_pb2.PRODUCTION, common_pb2.BATCH, common_pb2.OPPORTUNISTIC},
    )
    offered: dict[int | None, float] = {}

    def clear(step: Clear) -> None:
        (window,) = class_windows(NOW, [open_slice("s")], step.heads, CAP)
        offered[step.priority] = window.length_seconds

    assert drive(steps, lambda job: False, clear) == [blocked]
    assert offered == {
        common_pb2.PRODUCTION: CAP,
        common_pb2.BATCH: 120.0,
        common_pb2.OPPORTUNISTIC: 120.0,
    }


def test_the_router_describes_windows_by_family_and_announces_any_classs_cut() -> None:
    family = Demand(gpus=0, mig_profile="3g.40gb").family
    zone = SimpleNamespace(config=ZoneConfig(), blocked_starts={family: (common_pb2.BATCH, NOW)})
    market = Atomizer(cast(Any, zone))
    mig = common_pb2.Window(
        agent_id="a", slice_id="gpu1/3g.40gb@0", kind=common_pb2.MIG, mig_profile="3g.40gb",
        gpu_milli=1000, memory_bytes=40 * GIB, end_unix=NOW + 60.0,
    )  # fmt: skip
    whole = common_pb2.Window(agent_id="a", slice_id="gpu0", kind=common_pb2.WHOLE_GPU)
    assert market._open_slice(mig).family == family
    assert market._open_slice(mig).end == NOW + 60.0
    assert market._open_slice(whole).family == Demand(gpus=1).family
    # A client is announced the length offered to any class: the batch head's cut too.
    assert market.any_class_heads() == {family: NOW}


def test_a_restarted_job_s_claim_stops_extensions_on_slices_that_fit_it_only() -> None:
    """A rigid job requeued after a memory kill claims every slice with the memory it now
    needs, whatever the slice's family: a piece there does not extend in place past the
    claim's start. Free slices, and held ones too small for it, are left as they were."""
    small = OpenSlice("a", "small", 20 * GIB, 285, slice_family("2g.20gb"), 0.0, "mig", "j1")
    big = OpenSlice("a", "big", 80 * GIB, 1000, slice_family("7g.80gb"), 0.0, "mig", "j2")
    slices = [open_slice("free"), open_slice("held", held_by="j3"), small, big]
    claims = [(40 * GIB, NOW + 300.0), (30 * GIB, NOW + 600.0)]
    got = lengths(class_windows(NOW, slices, {}, CAP, claims=claims))
    assert got == {"free": CAP, "held": 300.0, "small": CAP, "big": 300.0}
    # A head's earlier cut still wins on its family; a claim due now leaves nothing to extend.
    got = lengths(class_windows(NOW, slices, {MIG40: NOW + 100.0}, CAP, claims=claims))
    assert got == {"free": 100.0, "held": 100.0, "small": CAP, "big": 300.0}
    got = lengths(class_windows(NOW, slices, {}, CAP, claims=[(40 * GIB, NOW)]))
    assert got == {"free": CAP, "small": CAP}


def test_the_pass_hands_each_class_the_claims_of_its_class_and_the_higher_ones() -> None:
    mig = Demand(mig_profile="2g.20gb", gpu_memory_bytes=30 * GIB)
    jobs = [
        QueueItem("b-killed", 2, "t", 0.0, mig, 2, 0.0, is_restarted=True),
        QueueItem("o-killed", 3, "t", 0.0, mig, 2, 0.0, is_restarted=True),
    ]
    seen: dict[int | None, tuple[tuple[int, float], ...]] = {}

    def clear(step: Clear) -> None:
        seen[step.priority] = step.claims

    steps = class_order(QueueWalk(NOW), jobs, lambda j: j, lambda j, a: NOW + 50.0, {1, 2, 3})
    drive(steps, lambda j: False, clear)
    assert seen == {
        1: (),  # production pieces keep their slices against a batch job's claim
        2: ((30 * GIB, NOW + 50.0),),
        3: ((30 * GIB, NOW + 50.0), (30 * GIB, NOW + 50.0)),
    }


async def test_a_lower_class_s_head_due_now_leaves_a_higher_class_its_slice() -> None:
    """The round offers every usable slice; a batch rigid head expected to start now cuts
    the batch and lower classes' windows on its family, not production's. (Only what a
    client bidder of any class is shown is cut at every class's heads.) The round used to
    drop such slices for every class."""
    family = Demand(gpus=0, mig_profile="3g.40gb").family
    spec = zone_pb2.JobSpec(
        command=["x"],
        priority=common_pb2.PRODUCTION,
        resources=common_pb2.Resources(mig_profile="3g.40gb"),
        atomization=common_pb2.AtomizationContract(
            total_units=100,
            seconds_per_unit=[common_pb2.Quantile(q=0.5, value=1.0)],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=8 * GIB)],
        ),
    )
    job = zone_pb2.Job(job_id="prod", spec=spec, state=zone_pb2.QUEUED)
    zone = SimpleNamespace(
        config=ZoneConfig(),
        blocked_starts={family: (common_pb2.BATCH, 0.0)},  # due long ago: cut to nothing
        entries={"prod": Entry(job=job, need=Demand(mig_profile="3g.40gb"))},
        view=SimpleNamespace(agents={"a": SimpleNamespace(is_ready=True, address="a:1")}),
        shares={},
        quotas={},
    )
    market = Atomizer(cast(Any, zone))
    market.admit(job)
    window = common_pb2.Window(
        agent_id="a", slice_id="gpu1/3g.40gb@0", kind=common_pb2.MIG, mig_profile="3g.40gb",
        gpu_milli=428, memory_bytes=40 * GIB,
    )  # fmt: skip
    market.note_windows("a", [window])
    rnd = await market.open_round({}, {})
    assert rnd is not None and rnd.by_key[("a", window.slice_id)][2] == 0.0  # clients: none
    batch = rnd.machine.clear(Clear(common_pb2.BATCH, {family: 0.0}))
    assert batch.decisions == []
    production = rnd.machine.clear(Clear(common_pb2.PRODUCTION, {}))
    (start,) = production.decisions
    assert isinstance(start, Start) and start.award.bid.job_id == "prod"
