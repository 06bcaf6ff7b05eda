"""``laminar sim airlock``: the ladder against the OOM killer on synthetic and real curves."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_sim_cli import run_cli

from laminar_agent.core import AgentCore, GpuPressure
from laminar_agent.ledger import Ledger, Slice, SliceKind
from laminar_airlock.levels import Level
from laminar_airlock.traces import MemoryCurve
from laminar_api.v1 import common_pb2, zone_pb2
from laminar_base.errors import InvalidArgument
from laminar_sim import airlock_sim
from laminar_sim.airlock_sim import (
    ACTION_STEPS,
    GIB,
    SLICE_ID,
    TERMINAL_STATES,
    AirlockSimSpec,
    GpuPlan,
    MemberPlan,
    SubjobOutcome,
    build_workload,
    run_airlock_sim,
    run_policy,
)

STEP = 10.0


def synthetic_curves(pods: int = 12, samples: int = 16) -> list[MemoryCurve]:
    """Flat starts and late rises: many triples start below 75 % and cross 95 % of 80 GiB."""
    curves = []
    for n in range(pods):
        base = (12 + 2 * (n % 5)) * GIB
        rise = (10 + 5 * (n % 4)) * GIB
        values = tuple(base + (rise * max(0, i - 4)) // (samples - 5) for i in range(samples))
        curves.append(MemoryCurve(f"pod{n:02d}", STEP, values))
    return curves


def small_spec(**more: Any) -> AirlockSimSpec:
    fields: dict[str, Any] = {"gpus": 8, "seed": 3, "window": 12}
    fields.update(more)
    return AirlockSimSpec(**fields)


def without_timings(report: dict[str, Any]) -> dict[str, Any]:
    for figures in report["policies"].values():
        for key in ("wall_seconds", "events_per_second"):
            figures.pop(key)
    return report


def test_same_seed_same_report() -> None:
    spec = small_spec()
    plans = build_workload(synthetic_curves(), spec)
    assert plans == build_workload(synthetic_curves(), spec)
    first = without_timings(run_airlock_sim(spec, plans))
    again = without_timings(run_airlock_sim(spec, build_workload(synthetic_curves(), spec)))
    assert first == again
    assert first["policies"]["ladder"]["polls"] > 0
    other = build_workload(synthetic_curves(), small_spec(seed=4))
    assert other != plans


def killed_runs(outcome: SubjobOutcome) -> int:
    return outcome.ends.get("reclaimed", 0) + outcome.ends.get("oom", 0)


def flat(gib: float, samples: int = 12) -> tuple[int, ...]:
    return tuple(int(gib * GIB) for _ in range(samples))


def rising(start_gib: float, end_gib: float, samples: int = 12) -> tuple[int, ...]:
    """Flat for four samples, then a rise to ``end_gib``."""
    return tuple(
        int((start_gib + (end_gib - start_gib) * max(0, i - 3) / (samples - 4)) * GIB)
        for i in range(samples)
    )


def crowded_gpus(count: int) -> list[GpuPlan]:
    """The critical subjob grows to 50 GiB next to production and opportunistic work: the sum
    goes from 70 to 90 GiB, and suspending the opportunistic subjob alone makes room."""
    plans = []
    for index in range(count):
        members = (
            MemberPlan(f"g{index}-crit", rising(30, 50), STEP, 1, 1, "checkpoint", False),
            MemberPlan(f"g{index}-prod", flat(20), STEP, 2, 1, "checkpoint", False),
            MemberPlan(f"g{index}-opp", flat(20), STEP, 4, 3, "checkpoint", True),
        )
        plans.append(GpuPlan(index, members))
    return plans


def test_ladder_spares_high_priority_work_the_oom_killer_loses() -> None:
    spec = small_spec(gpus=4)
    plans = crowded_gpus(4)
    ladder = run_policy(spec, plans, "ladder")
    oom = run_policy(spec, plans, "oom-killer")
    for result in (ladder, oom):
        assert len(result.outcomes) == 12
    high = [o for o in ladder.outcomes.values() if o.priority <= 2]
    assert all(o.state == "completed" and o.lost_gpu_seconds == 0 for o in high)
    assert ladder.actions["suspend"] >= 4
    opp = [o for o in ladder.outcomes.values() if o.priority == 4]
    assert all(o.suspended_seconds > 0 for o in opp)  # what the ladder costs
    killed_high = [o for o in oom.outcomes.values() if o.priority <= 2 and killed_runs(o) > 0]
    assert len(killed_high) == 4 and all(o.lost_gpu_seconds > 0 for o in killed_high)
    figures = oom.figures()
    assert figures["high_priority_work_lost_gpu_seconds"] > 0
    assert ladder.figures()["high_priority_work_lost_gpu_seconds"] == 0


def test_without_a_grace_the_allocator_dies_of_cuda_oom() -> None:
    spec = small_spec(gpus=2, oom_grace_seconds=0.0)
    result = run_policy(spec, crowded_gpus(2), "oom-killer")
    dead = [o for o in result.outcomes.values() if o.ends.get("oom", 0) > 0]
    assert [o.subjob_id.split("-")[1] for o in dead] == ["crit", "crit"]
    assert all("last run ended: CUDA OOM" in o.reason for o in dead)


@pytest.mark.parametrize("policy", ["ladder", "oom-killer"])
def test_every_subjob_ends_with_a_reason_and_no_gpu_is_over_capacity(policy: str) -> None:
    spec = small_spec(gpus=12, release_share=0.5, window=30, seed=5, members=4)
    plans = build_workload(synthetic_curves(samples=40), spec)
    result = run_policy(spec, plans, policy)
    if policy == "ladder":  # every step but readdress (test_a_subjob_that_cannot_resume_moves)
        assert all(result.actions[step] > 0 for step in ACTION_STEPS if step != "readdress")
    ids = {m.subjob_id for plan in plans for m in plan.members}
    assert set(result.outcomes) == ids
    for outcome in result.outcomes.values():
        assert outcome.state in TERMINAL_STATES and outcome.reason
        if outcome.ends.get("reclaimed", 0) and "last run ended: CUDA" not in outcome.reason:
            assert "last run ended: airlock_reclaimed: " in outcome.reason
    assert result.overcapacity_after_poll == 0
    assert result.max_used_ratio_after_poll <= 1.0 + 1e-6
    figures = result.figures()
    assert sum(figures["terminal_states"].values()) == len(ids)


def test_killed_work_re_runs_through_the_routers_core_from_its_checkpoint() -> None:
    """GPU 0 overflows; GPU 1 runs one small subjob. The OOM killer's victim and the ladder's
    reclaimed subjob (free mode none) are reported to the router's core, which retries the
    job (a reclaim's retry is free, a CUDA OOM's counted): its placement try goes to the
    agents' cores, GPU 0's refuses it (Airlock's pressure, or the memory in use and its
    declaration reaching the critical mark) and GPU 1's takes it. The re-run starts from the checkpoint and completes; the
    work since that checkpoint is what is lost."""
    spec = small_spec(gpus=2, checkpoint_seconds=50.0)
    plans = [
        GpuPlan(
            0,
            (
                MemberPlan("a-crit", rising(30, 50), STEP, 1, 1, "checkpoint", False),
                MemberPlan("a-prod", flat(25), STEP, 2, 1, "checkpoint", False),
                MemberPlan("a-opp", flat(22), STEP, 4, 3, "none", True),
            ),
        ),
        GpuPlan(1, (MemberPlan("b-batch", flat(10, samples=2), STEP, 3, 2, "checkpoint", True),)),
    ]
    for policy in ("ladder", "oom-killer"):
        run = airlock_sim._Run(spec, plans, policy, None)
        result = run.run()
        victims = [o for o in result.outcomes.values() if killed_runs(o) > 0]
        assert victims, policy
        for victim in victims:
            assert victim.state == "completed", (policy, victim)
            job = run.ended_jobs[victim.subjob_id]
            first, last = job.placements[0], job.placements[-1]
            assert (first.agent_id, last.agent_id) == ("h0", "h1"), (policy, job)
            assert first.end_cause == (
                common_pb2.END_CAUSE_RECLAIMED
                if victim.ends.get("reclaimed")
                else common_pb2.END_CAUSE_EXITED
            )
            assert last.state == common_pb2.SUCCEEDED and job.attempts == 2
            assert job.state == zone_pb2.JOB_SUCCEEDED
            # lost = work since the checkpoint (restartable) or since start, times 1/3
            assert 0 < victim.lost_gpu_seconds <= 12 * STEP / 3
    ladder = run_policy(spec, plans, "ladder")
    (opp,) = [o for o in ladder.outcomes.values() if o.subjob_id == "a-opp"]
    assert opp.ends == {"reclaimed": 1}  # a stop frees nothing: it is reclaimed, then re-runs
    assert opp.lost_gpu_seconds <= 50.0 / 3 + 1e-6  # only the work since its checkpoint


def test_a_subjob_that_cannot_resume_moves_to_a_gpu_with_room() -> None:
    """GPU 0 stays at 70 of 80 GiB once its opportunistic subjob is suspended, so that subjob
    cannot resume there; it is readdressed once it has waited twice its work since checkpoint
    (at least 30 s) and restarts from its checkpoint on GPU 1, which has room."""
    spec = small_spec(gpus=2, checkpoint_seconds=20.0)
    plans = [
        GpuPlan(
            0,
            (
                MemberPlan("a-crit", rising(30, 50), STEP, 1, 1, "checkpoint", False),
                MemberPlan("a-prod", flat(20), STEP, 2, 1, "checkpoint", False),
                MemberPlan("a-opp", flat(20), STEP, 4, 3, "checkpoint", True),
            ),
        ),
        GpuPlan(1, (MemberPlan("b-batch", flat(10, samples=2), STEP, 3, 2, "checkpoint", True),)),
    ]
    run = airlock_sim._Run(spec, plans, "ladder", None)
    result = run.run()
    # The router's core moved it: a copy on h1 (the old host excluded), the old one retired.
    old, copy = run.ended_jobs["a-opp"].placements
    assert (old.agent_id, old.end_cause) == ("h0", common_pb2.END_CAUSE_READDRESSED)
    assert (copy.agent_id, copy.subjob_id) == ("h1", "a-opp-a1-m0-r1")
    assert copy.state == common_pb2.SUCCEEDED
    assert result.actions["suspend"] >= 1 and result.actions["readdress"] == 1
    assert result.moved == 1
    opp = result.outcomes["a-opp"]
    assert opp.ends == {"moved": 1} and opp.state == "completed"
    assert 0 < opp.lost_gpu_seconds <= 20.0 / 3 + 1e-6  # at most its work since checkpoint
    high = [o for o in result.outcomes.values() if o.priority <= 2]
    assert all(o.ends == {} and o.suspended_seconds == 0 for o in high)


def test_horizon_leaves_work_unfinished() -> None:
    spec = small_spec(gpus=2, horizon_seconds=5 * STEP)
    result = run_policy(spec, crowded_gpus(2), "oom-killer")
    assert {o.state for o in result.outcomes.values()} == {"unfinished"}
    figures = result.figures()
    assert figures["completion_ratio"] == 0.0
    # Completion by one window (the longest undisturbed run) and by 1.25 and 1.5 windows.
    assert list(figures["completion_ratio_by_time"]) == ["120s", "150s", "180s"]
    assert set(figures["completion_ratio_by_time"].values()) == {0.0}
    whole = run_policy(small_spec(gpus=2), crowded_gpus(2), "ladder").figures()
    by_time = list(whole["completion_ratio_by_time"].values())
    assert by_time == sorted(by_time) and 0 < by_time[-1] <= whole["completion_ratio"]


def test_stop_frees_share_sets_free_mode_none() -> None:
    curves = synthetic_curves()
    none = build_workload(curves, small_spec(stop_frees_share=0.0, release_share=0.0))
    every = build_workload(curves, small_spec(stop_frees_share=1.0, release_share=0.0))
    assert {m.free_mode for p in none for m in p.members} == {"none"}
    assert {m.free_mode for p in every for m in p.members} == {"checkpoint"}
    # The share changes the free modes only, not the curves, classes or restartability.
    strip = [[(m.curve, m.priority, m.restartable) for m in p.members] for p in none]
    assert strip == [[(m.curve, m.priority, m.restartable) for m in p.members] for p in every]


def test_skipped_polls_change_no_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ladder's run skips polls on GPUs whose memory is flat until the tracker or the policy
    can change its answer; with every poll run, the actions and outcomes are the same."""
    spec = small_spec(gpus=12, release_share=0.5, window=30, seed=5, members=4)
    plans = build_workload(synthetic_curves(samples=40), spec)
    logs: list[list[tuple[float, str, str]]] = []
    apply = airlock_sim._Run._apply

    def logged(run: Any, gpu: Any, action: Any, now: float) -> None:
        logs[-1].append((round(now, 6), action.step, action.subjob_id))
        apply(run, gpu, action, now)

    monkeypatch.setattr(airlock_sim._Run, "_apply", logged)
    logs.append([])
    skipping = run_policy(spec, plans, "ladder")
    monkeypatch.setattr(airlock_sim._Run, "_is_flat", staticmethod(lambda gpu: False))
    logs.append([])
    every = run_policy(spec, plans, "ladder")
    assert logs[0] == logs[1] and len(logs[0]) > 10
    assert skipping.outcomes == every.outcomes
    assert skipping.polls < every.polls


def write_genai_csv(folder: Path) -> Path:
    folder.mkdir()
    rows = ["timestamp_anon,value,container_ip\n"]
    for curve in synthetic_curves():
        repeated = curve.used_bytes * 8  # the loader keeps pods with >= 100 samples
        for i, value in enumerate(repeated):
            rows.append(f"{i * STEP},{value},{curve.pod}\n")
    (folder / "pod_gpu_memory_used_bytes_anon.csv").write_text("".join(rows))
    return folder


def test_cli_json_table_and_plot(tmp_path: Path) -> None:
    trace = write_genai_csv(tmp_path / "genai")
    argv = ["sim", "airlock", "--trace-dir", str(trace), "--gpus", "4", "--window", "12"]
    code, out = run_cli([*argv, "-o", "json"])
    assert code == 0
    report = json.loads(out)
    assert report["experiment"] == "airlock" and set(report["policies"]) == {
        "ladder",
        "oom-killer",
    }
    assert report["subjobs"] == 12
    plot = tmp_path / "lost.png"
    code, out = run_cli([*argv, "--plot", str(plot)])
    assert code == 0 and "high-priority work lost" in out and "oom-killer" in out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--gpus", "0"], "--gpus"),
        (["--policies", "ladder,fifo"], "--policies"),
        (["--poll-seconds", "0"], "--poll-seconds"),
        (["--plot", "x.pdf"], "--plot"),
    ],
)
def test_bad_input_names_the_flag(tmp_path: Path, argv: list[str], flag: str) -> None:
    trace = write_genai_csv(tmp_path / "genai")
    with pytest.raises(InvalidArgument) as err:
        run_cli(["sim", "airlock", "--trace-dir", str(trace), *argv])
    assert err.value.field == flag


def test_missing_trace_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument) as err:
        run_cli(["sim", "airlock", "--trace-dir", str(tmp_path / "none")])
    assert err.value.field == "--trace-dir"


def test_on_the_genai_trace(traces_dir: Path) -> None:
    """A few GPUs on the real curves (skips with a reason when ../shared/traces is absent)."""
    from laminar_airlock.traces import load_memory_curves

    trace = traces_dir / "alibaba-genai-v2026"
    if not trace.is_dir():
        pytest.skip(f"{trace} is not present")
    spec = AirlockSimSpec(gpus=6, seed=1, window=30)
    plans = build_workload(load_memory_curves(trace), spec)
    report = run_airlock_sim(spec, plans)
    ladder, oom = report["policies"]["ladder"], report["policies"]["oom-killer"]
    assert ladder["subjobs"] == oom["subjobs"] == 18
    assert ladder["overcapacity_after_poll"] == 0
    assert (
        ladder["high_priority_work_lost_gpu_seconds"] <= oom["high_priority_work_lost_gpu_seconds"]
    )


@pytest.mark.parametrize("policy", ["ladder", "oom-killer"])
def test_every_run_starts_where_the_routers_and_the_agents_cores_put_it(
    policy: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each run the simulator starts on a GPU (the workload's first runs, re-runs, moved
    copies) is live on that GPU's agent core and placed there by the router's core."""
    spec = small_spec(gpus=12, release_share=0.5, window=30, seed=5, members=4)
    plans = build_workload(synthetic_curves(samples=40), spec)
    place = airlock_sim._Run._place
    started: list[str] = []

    def checked(run: Any, sub: Any, gpu: Any, now: float) -> None:
        agent = run.agents[gpu.index]
        live = agent.core.subjob(sub.run_id)
        assert live is not None and live.slice_ids == (airlock_sim.SLICE_ID,)
        entry = run.core.entries[sub.plan.subjob_id]
        (placement,) = [p for p in entry.job.placements if p.subjob_id == sub.run_id]
        assert placement.agent_id == agent.agent_id
        started.append(sub.run_id)
        place(run, sub, gpu, now)

    monkeypatch.setattr(airlock_sim._Run, "_place", checked)
    result = run_policy(spec, plans, policy)
    reruns = sum(killed_runs(o) + o.ends.get("moved", 0) for o in result.outcomes.values())
    waiting = sum(o.reason.startswith("queued at") for o in result.outcomes.values())
    # Every run that ended early started again once, unless it still waited at the horizon.
    assert reruns > 0 and len(started) == reruns - waiting


def test_a_move_no_agent_admits_is_asked_again_at_each_heartbeat(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As above, but GPU 1's share left free by its short subjob sits beside 66 of 80 GiB in
    use (its two others declared 10 GiB each, so its summary shows room): with the copy's
    20 GiB that is past Airlock's 80 % target, its agent's core refuses the copy, the router finds
    no host; the agent asks again at each heartbeat (every second) until the ladder settles
    the subjob otherwise, and nothing is moved."""
    refusals: list[str] = []
    refuse = AgentCore.pressure_refusal

    def recorded(core: AgentCore, declared: int, slice_ids: Any) -> str:
        why = refuse(core, declared, slice_ids)
        if why:
            refusals.append(why)
        return why

    monkeypatch.setattr(AgentCore, "pressure_refusal", recorded)
    spec = small_spec(gpus=2, checkpoint_seconds=20.0)
    grown = (10 * GIB, *flat(33, samples=19))  # declares 10 GiB, uses 33 from 10 s on
    plans = [
        GpuPlan(
            0,
            (
                MemberPlan("a-crit", rising(30, 50), STEP, 1, 1, "checkpoint", False),
                MemberPlan("a-prod", flat(20), STEP, 2, 1, "checkpoint", False),
                MemberPlan("a-opp", flat(20), STEP, 4, 3, "checkpoint", True),
            ),
        ),
        GpuPlan(
            1,
            (
                MemberPlan("b-short", flat(5, samples=2), STEP, 3, 2, "checkpoint", True),
                MemberPlan("b-big", grown, STEP, 3, 2, "checkpoint", True),
                MemberPlan("b-bigger", grown, STEP, 3, 2, "checkpoint", True),
            ),
        ),
    ]
    result = run_policy(spec, plans, "ladder")
    assert result.actions["readdress"] == 1
    assert result.moved == 0 and result.move_retries > 5
    assert result.outcomes["a-opp"].ends.get("moved", 0) == 0
    assert any(why.startswith("gpu0 would hold 86.0 of 80.0 GiB") for why in refusals), refusals[:3]


@pytest.mark.parametrize("used_gib", [0, 1, 30, 60, 70, 75, 76, 80])
@pytest.mark.parametrize("room_gib", [0, 7, 10, 80])
@pytest.mark.parametrize("level", [Level.NORMAL, Level.ELEVATED])
def test_pass_signature_counts_the_declarations_the_agent_admits(
    used_gib: int, room_gib: int, level: Level
) -> None:
    """What the skipped pass's signature reads of an agent: how many of the ascending
    declarations its ledger has room for and its core does not refuse, as asking each
    (``AgentCore.pressure_refusal``) would count."""
    core = AgentCore(Ledger([Slice(SLICE_ID, SliceKind.SHARED_GPU, 0, "u", "GPU", 80 * GIB)]))
    core.note_pressure({SLICE_ID: GpuPressure(level, used_gib * GIB, 80 * GIB)})
    declared = [g * GIB for g in (1, 3, 3, 5, 8, 10, 10, 12, 19, 30, 50)]
    room = room_gib * GIB
    got = airlock_sim._admitted(declared, room, core)
    assert got == sum(
        1 for d in declared if d <= room and not core.pressure_refusal(d, (SLICE_ID,))
    )
    assert airlock_sim._admitted([], room, core) == 0


def every_agent_signature(run: Any) -> tuple[object, ...] | None:
    """The skipped pass's signature read from every agent, as it was before the agents'
    entries were kept (``_AgentEntries``): the plain walk they must equal."""
    needs = run.waiting_needs()
    if not needs:
        return None
    milli = min(n.gpu_milli for _, n in needs)
    declared = sorted(n.gpu_memory_bytes for _, n in needs)
    hosts: list[object] = []
    admitting = False
    for agent in run.agents:
        usage = agent.core.ledger.usage(SLICE_ID)
        if 1000 - usage[0] - usage[1] < milli:
            hosts.append(None)
            continue
        room = run.total - usage[2] - usage[3]
        agent.core.note_pressure({SLICE_ID: run._pressure(agent)})
        lo = airlock_sim._admitted(declared, room, agent.core)
        admitting = admitting or lo > 0
        hosts.append((agent.index, usage, lo))
    return (needs, tuple(hosts)) if admitting else None


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 50),
    gpus=st.integers(2, 10),
    members=st.integers(2, 4),
    stop_frees_share=st.sampled_from([0.0, 0.5, 1.0]),
    release_share=st.sampled_from([0.0, 0.5]),
    checkpoint_seconds=st.sampled_from([20.0, 50.0]),
    ramp_seconds=st.sampled_from([1.0, 5.0]),
    policy=st.sampled_from(["ladder", "oom-killer"]),
)
def test_kept_agent_entries_equal_reading_every_agent(
    seed: int,
    gpus: int,
    members: int,
    stop_frees_share: float,
    release_share: float,
    checkpoint_seconds: float,
    ramp_seconds: float,
    policy: str,
) -> None:
    """At every queue pass the signature from the kept entries is the one that reading every
    agent gives (so the same passes are skipped), with its entries read again as agents
    change and their memory moves."""
    spec = small_spec(
        gpus=gpus,
        seed=seed,
        window=30,
        members=members,
        stop_frees_share=stop_frees_share,
        release_share=release_share,
        checkpoint_seconds=checkpoint_seconds,
        ramp_seconds=ramp_seconds,
    )
    plans = build_workload(synthetic_curves(samples=40), spec)
    compared: list[bool] = []
    signature = airlock_sim._Run.pass_signature

    def checked(run: Any) -> tuple[object, ...] | None:
        kept = signature(run)
        if run.waiting_needs():  # the agents were read
            for agent, reading in zip(run.agents, run.agent_entries.readings, strict=True):
                if reading is not None:  # a reading kept: Airlock reads the GPU so now
                    assert reading[0] == run._pressure(agent)
        plain = every_agent_signature(run)
        assert kept == plain
        compared.append(kept is not None)
        return kept

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(airlock_sim._Run, "pass_signature", checked)
        run_policy(spec, plans, policy)
    assert compared
