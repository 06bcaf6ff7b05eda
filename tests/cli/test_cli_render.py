"""What `laminar job`, `jobs`, `agents`, `probe` and `airlock` show, with a fixed clock."""

from __future__ import annotations

import io
import json
import re
import time

from rich.console import Console, RenderableType

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_cli import render
from laminar_cli.agents import inventory_table

NOW = 1_800_000_000.0


def _text(renderable: RenderableType) -> str:
    console = Console(file=io.StringIO(), record=True, width=240, markup=False, color_system=None)
    console.print(renderable)
    return console.export_text()


def _queued_job() -> zone_pb2.Job:
    return zone_pb2.Job(
        job_id="j-42",
        spec=zone_pb2.JobSpec(
            name="eval",
            command=["python", "eval.py"],
            resources=common_pb2.Resources(mig_profile="3g.40gb"),
            priority=common_pb2.PRODUCTION,
            tenant="vision",
            gang_size=2,
            after=["j-1"],
            max_retries=2,
        ),
        state=zone_pb2.QUEUED,
        reason="no host with a free 3g.40gb slice; 2 of 12 hosts match; queue position 3",
        submitted_unix=NOW - 12,
        queue_position=3,
        expected_start_unix=NOW + 40,
        attempts=2,
        probes=4,
        bounces=1,
        zone="zone-1",
    )


def test_relative_and_span() -> None:
    assert render.relative(NOW + 40, NOW) == "in about 40 s"
    assert render.relative(NOW + 600, NOW) == "in about 10 min"
    assert render.relative(NOW - 3.25, NOW) == "3.2 s ago"
    assert render.relative(NOW + 0.2, NOW) == "now"
    assert render.span(3 * 3600) == "3.0 h"


def test_job_detail_explains_why_it_waits_and_when_it_starts() -> None:
    job = _queued_job()
    text = _text(render.job_detail(job, NOW))
    assert "queued" in text
    assert "why waiting" in text and "2 of 12 hosts match" in text
    expected_clock = time.strftime("%H:%M:%S", time.localtime(NOW + 40))
    assert f"in about 40 s (at {expected_clock})" in text
    assert re.search(r"queue position\s+3\s", text)
    assert "gang of 2, each MIG 3g.40gb" in text
    assert "vision / production, long" in text
    assert "after" in text and "j-1" in text
    assert "2 attempt(s), 4 probe(s), 1 bounce(s)" in text
    assert "0 of 2 used" in text
    assert "subjobs" not in text  # nothing placed yet


def test_job_detail_of_a_finished_job_shows_placements() -> None:
    job = zone_pb2.Job(
        job_id="j-7",
        spec=zone_pb2.JobSpec(name="train", command=["x"], resources=common_pb2.Resources(gpus=2)),
        state=zone_pb2.JOB_SUCCEEDED,
        reason="all subjobs exited 0",
        submitted_unix=NOW - 100,
        started_unix=NOW - 90,
        ended_unix=NOW - 30,
        expected_start_unix=NOW - 95,
        placements=[
            zone_pb2.Placement(
                subjob_id="j-7-0",
                agent_id="host-1",
                slice_ids=["gpu0", "gpu1"],
                state=common_pb2.SUCCEEDED,
                exit_code=0,
                started_unix=NOW - 90,
                ended_unix=NOW - 30,
                run_seconds=60,
                attempt=1,
                reason="exited 0",
            )
        ],
    )
    text = _text(render.job_detail(job, NOW))
    assert "succeeded" in text and "reason" in text and "why waiting" not in text
    assert "expected start" not in text  # only shown while waiting
    assert "waited 10 s" in text and "ran 60 s" in text
    assert "j-7-0" in text and "host-1" in text and "gpu0,gpu1" in text and "exited 0" in text
    assert render.where(job) == "host-1:gpu0,gpu1"


def test_where_shows_the_latest_attempt_of_each_member() -> None:
    job = zone_pb2.Job(
        placements=[
            zone_pb2.Placement(member=0, attempt=1, agent_id="a", slice_ids=["gpu0"]),
            zone_pb2.Placement(member=0, attempt=2, agent_id="b", slice_ids=["gpu3"]),
            zone_pb2.Placement(member=1, attempt=1, agent_id="c"),
        ]
    )
    assert render.where(job) == "b:gpu3 c:cpu"


def test_jobs_table_and_json() -> None:
    job = _queued_job()
    text = _text(render.jobs_table([job], NOW))
    assert "1 job" in text and "j-42" in text and "#3: no host" in text
    data = json.loads(render.to_json(job))
    assert data["job_id"] == "j-42" and data["state"] == "QUEUED"
    assert data["spec"]["resources"]["mig_profile"] == "3g.40gb"
    assert data["started_unix"] == 0  # zeros are printed, not omitted


def test_agents_probe_and_airlock_tables() -> None:
    summary = common_pb2.AgentSummary(
        agent_id="host-0",
        total_gpus=3,
        running_subjobs=2,
        suspended_subjobs=1,
        pressure=common_pb2.ELEVATED,
        shapes=[
            common_pb2.ShapeCapacity(shape="gpu:H100-80GB", free=1, total=2),
            common_pb2.ShapeCapacity(shape="share:A100-80GB", free=1, total=1, max_free_milli=500),
        ],
    )
    agent = zone_pb2.AgentInfo(
        agent_id="host-0",
        address="127.0.0.1:5000",
        state=zone_pb2.AGENT_DRAINING,
        summary=summary,
        last_heartbeat_unix=NOW - 2,
        hostname="box",
    )
    text = _text(render.agents_table([agent], NOW))
    assert "draining" in text and "2 (+1 suspended)" in text and "elevated" in text
    assert "failed" not in text and "degraded" not in text
    agent.summary.degraded_gpus.add(index=1, reason="Xid 79: fell off the bus", failed=True)
    agent.summary.degraded_gpus.add(index=2, reason="nvmlDeviceGetMemoryInfo: Unknown Error")
    text = _text(render.agents_table([agent], NOW))
    assert "3 (1 failed, 1 degraded)" in text
    assert "gpu:H100-80GB 1/2" in text and "share:A100-80GB 1/1 (max 0.5)" in text

    reply = zone_pb2.ProbeJobReply(
        hosts=[
            zone_pb2.HostScore(agent_id="host-2", fits=False, reason="no free 3g.40gb slice"),
            zone_pb2.HostScore(
                agent_id="host-1",
                fits=True,
                score=0.75,
                lease=agent_pb2.Lease(lease_id="l-1", slice_ids=["gpu0"], expires_unix=NOW + 5),
            ),
        ],
        hosts_matching=2,
        hosts_total=5,
    )
    text = _text(render.probe_table(reply, show_leases=True, now_unix=NOW))
    assert "1 of 2 probed host(s) could take it now; 2 of 5 host(s) match" in text
    assert text.index("host-1") < text.index("host-2")  # fitting hosts first
    assert "l-1 on gpu0, expires in about 5.0 s" in text

    state = agent_pb2.AirlockState(
        host_level=common_pb2.NORMAL,
        slices=[
            agent_pb2.SliceLevel(
                slice_id="gpu1",
                level=common_pb2.CRITICAL_PRESSURE,
                used_bytes=78 * 1024**3,
                total_bytes=80 * 1024**3,
            )
        ],
        suspended=[
            common_pb2.Subjob(
                spec=common_pb2.SubjobSpec(
                    subjob_id="s-1", job_id="j-1", priority=common_pb2.OPPORTUNISTIC
                ),
                slice_ids=["gpu1"],
                suspended_seconds=12,
            )
        ],
        recent_actions=[
            agent_pb2.AirlockAction(
                at_unix=NOW - 1, step="suspend", subjob_id="s-1", slice_id="gpu1", reason="78 of 80"
            )
        ],
    )
    text = _text(render.airlock_view("host-0", state, NOW))
    assert "host-0: host pressure normal" in text
    assert "critical" in text and "97.5" in text
    assert "suspended subjobs (1)" in text and "opportunistic" in text and "12 s" in text
    assert "recent actions (1)" in text and "suspend" in text and "78 of 80" in text


def test_job_detail_of_an_atomized_job_shows_units_profile_and_where_each_subjob_ran() -> None:
    gib = 1 << 30
    job = zone_pb2.Job(
        job_id="j-9",
        spec=zone_pb2.JobSpec(
            command=["x"],
            atomization=common_pb2.AtomizationContract(total_units=100),
        ),
        state=zone_pb2.JOB_RUNNING,
        atomization=zone_pb2.AtomizationProgress(
            units_done=40,
            units_total=100,
            subjobs=3,
            violation_rate=0.25,
            last_losing_score=0.61,
            seconds_per_unit=[
                common_pb2.Quantile(q=0.5, value=2),
                common_pb2.Quantile(q=0.95, value=3),
            ],
            peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=12 * gib)],
        ),
        placements=[
            zone_pb2.Placement(
                subjob_id="j-9-u0-s0",
                agent_id="host-1",
                slice_ids=["gpu0"],
                state=common_pb2.KILLED,
                unit_start=0,
                unit_count=30,
                units_done=12,
                reason="readdressed: back to the market",
            ),
            zone_pb2.Placement(
                subjob_id="j-9-u12-s1",
                agent_id="host-2",
                slice_ids=["gpu1/3g.40gb@0"],
                state=common_pb2.SUCCEEDED,
                unit_start=12,
                unit_count=28,
                units_done=28,
            ),
        ],
    )
    text = _text(render.job_detail(job, NOW))
    assert "40 of 100 done in 3 subjob(s); violation rate 25.0%" in text
    assert "per unit p50 2.0 s, p95 3.0 s; peak memory p95 12.0GiB" in text
    assert "a score of 0.610" in text
    assert "0..29" in text and "12..39" in text
    assert "host-2" in text and "gpu1/3g.40gb@0" in text and "back to the market" in text


def test_job_detail_and_json_show_each_subjobs_end_cause() -> None:
    job = zone_pb2.Job(
        job_id="j-8",
        spec=zone_pb2.JobSpec(name="train", command=["x"], resources=common_pb2.Resources(gpus=1)),
        state=zone_pb2.JOB_RUNNING,
        submitted_unix=NOW - 100,
        started_unix=NOW - 90,
        attempts=1,
        placements=[
            zone_pb2.Placement(
                subjob_id="j-8-a1-m0",
                agent_id="host-1",
                state=common_pb2.KILLED,
                end_cause=common_pb2.END_CAUSE_READDRESSED,
                started_unix=NOW - 90,
                ended_unix=NOW - 30,
                attempt=1,
                reason="readdressed: moved to host-2 after Airlock suspended it on host-1",
            ),
            zone_pb2.Placement(
                subjob_id="j-8-a1-m0-r1",
                agent_id="host-2",
                state=common_pb2.RUNNING,
                started_unix=NOW - 29,
                attempt=1,
            ),
        ],
    )
    text = _text(render.job_detail(job, NOW))
    assert "cause" in text
    ended, live = (line for line in text.splitlines() if "j-8-a1-m0" in line)
    assert " readdressed " in ended and "readdressed:" in ended  # the token, then the reason
    assert " running " in live and " - " in live
    data = json.loads(render.to_json(job))
    assert [p["end_cause"] for p in data["placements"]] == [
        "END_CAUSE_READDRESSED",
        "END_CAUSE_UNSPECIFIED",
    ]


def test_the_reason_code_shows_as_a_short_token_beside_the_prose() -> None:
    """Scripts match the token (squeue's %r); the prose may change."""
    job = _queued_job()
    job.reason_code = zone_pb2.REASON_RESOURCES
    assert "[resources]" in _text(render.jobs_table([job], NOW))
    # As the CLI's console prints it (markup on): the token is text, not a style tag.
    console = Console(file=io.StringIO(), record=True, width=240, color_system=None)
    console.print(render.jobs_table([job], NOW, wide=True))
    assert "[resources]" in console.export_text()
    assert "[resources]" in _text(render.job_detail(job, NOW))
    assert json.loads(render.to_json(job))["reason_code"] == "REASON_RESOURCES"
    job.state, job.reason_code = zone_pb2.JOB_SUSPENDED, zone_pb2.REASON_SUSPENDED
    job.reason = "subjob j-42-0 suspended by Airlock: gpu0 at 78.1 of 80.0 GiB"
    assert "suspended" in _text(render.job_detail(job, NOW))
    assert "[suspended]" in _text(render.jobs_table([job], NOW))


def test_inventory_names_each_gpu_held_back_and_why() -> None:
    inv = agent_pb2.Inventory(
        agent_id="host-0",
        backend="nvml",
        gpus=[
            agent_pb2.Gpu(index=0, uuid="GPU-a", model="H100-80GB"),
            agent_pb2.Gpu(index=1, uuid="GPU-b", model="H100-80GB"),
        ],
        degraded_gpus=[
            common_pb2.DegradedGpu(index=1, uuid="GPU-b", reason="Xid 79\x1b[2J", failed=True)
        ],
    )
    lines = _text(inventory_table(inv)).splitlines()
    row = next(line for line in lines if "GPU-b" in line)
    assert "failed: Xid 79" in row and "\x1b" not in row
    assert "failed" not in next(line for line in lines if "GPU-a" in line)
