"""How the `laminar` command shows jobs, agents, probes and Airlock state to people and scripts.

Pure formatting: messages in, rich renderables or JSON text out. The clock is
passed in (``now_unix``) so the output can be tested exactly.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from google.protobuf.message import Message
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from laminar_api.v1 import agent_pb2, common_pb2, zone_pb2
from laminar_base.causes import ENDED_SUBJOB_STATES, FINISHED_JOB_STATES, end_cause
from laminar_base.units import format_size
from laminar_cli.jobspec import describe_resources
from laminar_zone.reasons import reason_of

#: A job's own end (a forwarded job ends in the zone it went to).
TERMINAL_JOB_STATES = FINISHED_JOB_STATES
#: Job state names as users type and read them (``--state running,queued``).
JOB_STATE_NAMES: dict[str, zone_pb2.JobState] = {
    "pending": zone_pb2.PENDING,
    "queued": zone_pb2.QUEUED,
    "waiting": zone_pb2.WAITING,
    "running": zone_pb2.JOB_RUNNING,
    "suspended": zone_pb2.JOB_SUSPENDED,
    "succeeded": zone_pb2.JOB_SUCCEEDED,
    "failed": zone_pb2.JOB_FAILED,
    "cancelled": zone_pb2.JOB_CANCELLED,
    "forwarded": zone_pb2.FORWARDED,
}
_STATE_STYLE: dict[int, str] = {
    zone_pb2.PENDING: "cyan",
    zone_pb2.QUEUED: "yellow",
    zone_pb2.WAITING: "yellow",
    zone_pb2.JOB_RUNNING: "green",
    zone_pb2.JOB_SUSPENDED: "bold yellow",
    zone_pb2.JOB_SUCCEEDED: "bold green",
    zone_pb2.JOB_FAILED: "bold red",
    zone_pb2.JOB_CANCELLED: "magenta",
    zone_pb2.FORWARDED: "blue",
}


def to_json(message: Message) -> str:
    """Protobuf JSON with the .proto field names and every field, zeros included."""
    return str(
        _json_format().MessageToJson(
            message,
            preserving_proto_field_name=True,
            always_print_fields_with_no_presence=True,
            indent=2,
        )
    )


def job_state_name(state: int) -> str:
    for name, value in JOB_STATE_NAMES.items():
        if value == state:
            return name
    return "unknown"


def end_cause_name(cause: int) -> str:
    """The cause token users read (``readdressed``); ``-`` when there is none."""
    return end_cause(cause).token or "-"


def subjob_state_name(state: int) -> str:
    if state == common_pb2.SUBJOB_STATE_UNSPECIFIED:
        return "-"
    return common_pb2.SubjobState.Name(state).lower()


def priority_name(priority: int) -> str:
    if priority == common_pb2.PRIORITY_CLASS_UNSPECIFIED:
        return "batch"
    return common_pb2.PriorityClass.Name(priority).lower()


def lifecycle_name(lifecycle: int) -> str:
    if lifecycle == common_pb2.LIFECYCLE_CLASS_UNSPECIFIED:
        return "long"
    return common_pb2.LifecycleClass.Name(lifecycle).lower()


def state_text(state: int) -> Text:
    return Text(job_state_name(state), style=_STATE_STYLE.get(state, ""))


def span(seconds: float) -> str:
    """A rough duration a person reads at a glance: ``40 s``, ``3 min``, ``2.5 h``."""
    seconds = max(0.0, seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def relative(at_unix: float, now_unix: float) -> str:
    """``in about 40 s`` for the future, ``12 s ago`` for the past."""
    delta = at_unix - now_unix
    if abs(delta) < 1.0:
        return "now"
    if delta > 0:
        return f"in about {span(delta)}"
    return f"{span(-delta)} ago"


def clock(at_unix: float, now_unix: float) -> str:
    """Local wall-clock time; the date is added when it is not today."""
    if at_unix <= 0:
        return "-"
    at = time.localtime(at_unix)
    if time.strftime("%Y-%m-%d", at) == time.strftime("%Y-%m-%d", time.localtime(now_unix)):
        return time.strftime("%H:%M:%S", at)
    return time.strftime("%Y-%m-%d %H:%M:%S", at)


def expected_start(job: zone_pb2.Job, now_unix: float) -> str:
    """``in about 40 s (at 10:41:12)``; ``unknown`` when the router has no estimate."""
    if job.expected_start_unix <= 0:
        return "unknown"
    if job.expected_start_unix <= now_unix:
        return f"any moment now (was expected at {clock(job.expected_start_unix, now_unix)})"
    return (
        f"{relative(job.expected_start_unix, now_unix)} "
        f"(at {clock(job.expected_start_unix, now_unix)})"
    )


def waited_seconds(job: zone_pb2.Job, now_unix: float) -> float:
    """Time from submission to start (or until now / the end when it never started)."""
    if job.submitted_unix <= 0:
        return 0.0
    if job.started_unix > 0:
        return job.started_unix - job.submitted_unix
    end = job.ended_unix if job.ended_unix > 0 else now_unix
    return end - job.submitted_unix


def ran_seconds(job: zone_pb2.Job, now_unix: float) -> float:
    if job.started_unix <= 0:
        return 0.0
    end = job.ended_unix if job.ended_unix > 0 else now_unix
    return end - job.started_unix


def where(job: zone_pb2.Job) -> str:
    """``host-0:gpu1, host-2:gpu0`` for the latest attempt of every member."""
    latest: dict[int, zone_pb2.Placement] = {}
    for placement in job.placements:
        current = latest.get(placement.member)
        if current is None or placement.attempt >= current.attempt:
            latest[placement.member] = placement
    parts = []
    for member in sorted(latest):
        placement = latest[member]
        slices = ",".join(placement.slice_ids) or "cpu"
        parts.append(f"{placement.agent_id}:{slices}")
    return " ".join(parts)


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
M = TypeVar("M", bound=Message)


def printable(message: M) -> M:
    """A copy of ``message`` whose strings show control characters as ``\\xNN``.

    Job names, commands, reasons and the rest are whoever submitted them: an escape
    sequence in them must not reach an operator's terminal (retitle it, clear it, forge
    lines). Tables and lines the CLI prints go through this; ``-o json`` escapes by itself.
    """
    copy = type(message)()
    copy.CopyFrom(message)
    _scrub(copy)
    return copy


def _escape(text: str) -> str:
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def _scrub(message: Message) -> None:
    for field, value in message.ListFields():
        if isinstance(value, str):
            setattr(message, field.name, _escape(value))
        elif isinstance(value, Message):
            _scrub(value)
        elif hasattr(value, "items"):  # a map
            items = dict(value.items())
            value.clear()
            for key, item in items.items():
                key = _escape(key) if isinstance(key, str) else key
                if isinstance(item, Message):
                    _scrub(item)
                    value[key].CopyFrom(item)
                else:
                    value[key] = _escape(item) if isinstance(item, str) else item
        elif isinstance(value, (int, float, bytes)):  # scalars other than text
            continue
        else:  # a repeated field
            elements = list(value)
            if elements and isinstance(elements[0], str):
                value[:] = [_escape(e) for e in elements]
            else:
                for item in elements:
                    if isinstance(item, Message):
                        _scrub(item)


def jobs_table(
    jobs: Sequence[zone_pb2.Job],
    now_unix: float,
    *,
    wide: bool = False,
    headers: bool = True,
    width: int = 0,
) -> Table:
    """One line per job. By default the table fits ``width`` (the terminal): job ids,
    states and ages stay whole, the text columns are cut with an ellipsis, the reason
    getting what is left (the full text is in `laminar job ID`). ``wide`` keeps every
    column whole and adds retries and expected start. ``headers=False`` prints rows
    only (for scripts)."""
    jobs = [printable(j) for j in jobs]
    title = f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}" if headers else None
    table = Table(
        title=title,
        title_justify="left",
        show_header=headers,
        box=None if not headers else box.HEAVY_HEAD,
    )
    rows = [_job_row(job, now_unix, wide) for job in jobs]
    columns = ["job", "name", "tenant", "state", "class", "resources", "where", "age"]
    if wide:
        columns += ["retries", "expected start"]
    columns.append("reason")
    if not wide and width:
        columns, rows = _fit(columns, rows, width)
    for column in columns:
        table.add_column(column, no_wrap=not wide or column in ("job", "state"), overflow="fold")
    for row in rows:
        # Text, not markup: a reason's "[resources]" or a job name in brackets is shown as is.
        table.add_row(*(state_text(c) if isinstance(c, int) else _plain(c) for c in row))
    return table


def _plain(cell: Any) -> Any:
    return Text(cell) if isinstance(cell, str) else cell


def _job_row(job: zone_pb2.Job, now_unix: float, wide: bool) -> list[Any]:
    resources = describe_resources(job.spec.resources)
    if job.spec.gang_size > 1:
        resources = f"{job.spec.gang_size} x ({resources})"
    reason = job.reason
    code = reason_token(job.reason_code)
    if code:
        reason = f"[{code}] {reason}"
    if job.state == zone_pb2.QUEUED and job.queue_position:
        reason = f"#{job.queue_position}: {reason}"
    row: list[Any] = [
        job.job_id,
        job.spec.name,
        job.spec.tenant or "-",
        int(job.state),
        priority_name(job.spec.priority),
        resources,
        where(job) or "-",
        span(now_unix - job.submitted_unix) if job.submitted_unix else "-",
    ]
    if wide:
        waiting = job.state in (zone_pb2.PENDING, zone_pb2.QUEUED, zone_pb2.WAITING)
        row += [
            f"{job.retries_used}/{job.spec.max_retries}",
            expected_start(job, now_unix) if waiting else "-",
        ]
    return [*row, reason]


#: Columns cut to fit a terminal, in the order they give way, and how narrow each may get.
_GIVES_WAY = (("where", 10), ("resources", 10), ("tenant", 8), ("name", 16), ("reason", 16))
#: Columns dropped, in this order, when cutting is not enough.
_DROPPED = ("where", "tenant", "class", "name")


def _fit(
    columns: list[str], rows: list[list[Any]], width: int
) -> tuple[list[str], list[list[Any]]]:
    """Cut text cells (then drop columns) so the table is at most ``width`` wide: 3
    characters of border and padding a column, plus one. Job ids, states and ages stay
    whole."""

    def shown(cell: Any) -> int:
        return len(job_state_name(cell)) if isinstance(cell, int) else len(str(cell))

    widths = {c: max([len(c)] + [shown(r[i]) for r in rows]) for i, c in enumerate(columns)}

    def excess() -> int:
        return sum(widths.values()) + 3 * len(widths) + 1 - width

    for name, floor in _GIVES_WAY:
        give = min(excess(), max(0, widths[name] - max(floor, len(name))))
        if give > 0:
            widths[name] -= give
    for name in _DROPPED:
        if excess() <= 0:
            break
        del widths[name]
    if excess() > 0:  # still too narrow: the reason takes what is left, down to 1
        widths["reason"] = max(1, widths["reason"] - excess())
    keep = [i for i, c in enumerate(columns) if c in widths]
    return [columns[i] for i in keep], [
        [row[i] if isinstance(row[i], int) else _cut(str(row[i]), widths[columns[i]]) for i in keep]
        for row in rows
    ]


def _cut(text: str, width: int) -> str:
    """``text`` in at most ``width`` characters, an ellipsis marking a cut."""
    if len(text) <= width:
        return text
    return text[: width - 1] + "…" if width > 1 else text[:width]


def _grid() -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", no_wrap=True)
    grid.add_column(overflow="fold")
    return grid


def reason_token(code: int) -> str:
    """The short name of a job's reason code (``resources``, ``dependency``), "" for none:
    what scripts match, as squeue's ``%r``."""
    return reason_of(code).token


def job_detail(job: zone_pb2.Job, now_unix: float) -> RenderableType:
    """Everything `laminar job ID` shows: a key/value block, then the placements."""
    job = printable(job)
    spec = job.spec
    grid = _grid()
    grid.add_row("job", Text(f"{job.job_id}  {spec.name}"))
    grid.add_row("state", state_text(job.state))
    if job.reason:
        label = (
            "why waiting"
            if job.state in (zone_pb2.PENDING, zone_pb2.QUEUED, zone_pb2.WAITING)
            else "reason"
        )
        code = reason_token(job.reason_code)
        grid.add_row(label, Text(f"[{code}] {job.reason}" if code else job.reason))
    if job.state in (zone_pb2.PENDING, zone_pb2.QUEUED, zone_pb2.WAITING):
        if job.queue_position:
            grid.add_row("queue position", str(job.queue_position))
        grid.add_row("expected start", expected_start(job, now_unix))
    if job.forwarded_to:
        grid.add_row("forwarded to", Text(job.forwarded_to))
    if spec.array:
        a = job.array
        limit = f", at most {a.limit} at once" if a.limit else ""
        grid.add_row(
            "array",
            Text(
                f"{spec.array}: {a.total} elements{limit}; {a.under_way} under way, "
                f"{a.held} waiting, {a.succeeded} succeeded, {a.failed} failed, "
                f"{a.cancelled} cancelled (elements are {job.job_id}_INDEX)"
            ),
        )
    if job.array_id:
        grid.add_row("array element", Text(f"index {job.array_index} of {job.array_id}"))
    grid.add_row(
        "tenant / class",
        Text(
            f"{spec.tenant or '-'} / {priority_name(spec.priority)}, {lifecycle_name(spec.lifecycle)}"
        ),
    )
    resources = describe_resources(spec.resources)
    if spec.gang_size > 1:
        resources = f"gang of {spec.gang_size}, each {resources}"
    grid.add_row("resources", Text(resources))
    grid.add_row("command", Text(" ".join(spec.command)))
    if spec.after:
        grid.add_row("after", Text(", ".join(spec.after)))
    grid.add_row(
        "submitted",
        f"{clock(job.submitted_unix, now_unix)} ({relative(job.submitted_unix, now_unix)})",
    )
    if job.started_unix:
        grid.add_row(
            "started",
            f"{clock(job.started_unix, now_unix)} (waited {span(waited_seconds(job, now_unix))})",
        )
    if job.ended_unix:
        grid.add_row(
            "ended", f"{clock(job.ended_unix, now_unix)} (ran {span(ran_seconds(job, now_unix))})"
        )
    if spec.time_limit_seconds:
        grid.add_row(
            "time limit",
            f"{span(spec.time_limit_seconds)} per run, time suspended by Airlock not counted",
        )
    grid.add_row(
        "placement effort",
        f"{job.attempts} attempt(s), {job.probes} probe(s), {job.bounces} bounce(s)",
    )
    grid.add_row("retries", f"{job.retries_used} of {spec.max_retries} used")
    grid.add_row(
        "copies",
        "at least once: runs on through partitions, a retry may overlap it"
        if spec.run_through_partitions
        else "at most one at a time: stopped by its host's fence when out of touch",
    )
    if job.zone:
        grid.add_row("zone", Text(job.zone))
    if job.client_request_id:
        grid.add_row("request id", Text(job.client_request_id))
    atomized = spec.HasField("atomization") and spec.atomization.total_units > 0
    if atomized:
        progress = job.atomization
        grid.add_row(
            "units",
            f"{progress.units_done} of {spec.atomization.total_units} done in "
            f"{progress.subjobs} subjob(s); violation rate {progress.violation_rate:.1%}",
        )
        grid.add_row("profile", Text(profile_text(progress)))
        if progress.last_losing_score:
            grid.add_row("last outbid by", f"a score of {progress.last_losing_score:.3f}")
    parts: list[RenderableType] = [grid]
    if job.placements:
        parts.append(placements_table(job.placements, now_unix, units=atomized))
    return Group(*parts)


def profile_text(progress: zone_pb2.AtomizationProgress) -> str:
    """The calibrated profile: time per unit and peak memory at each quantile."""
    time_part = ", ".join(f"p{q.q * 100:g} {span(q.value)}" for q in progress.seconds_per_unit)
    memory = ", ".join(
        f"p{q.q * 100:g} {format_size(int(q.value))}" for q in progress.peak_memory_bytes
    )
    return f"per unit {time_part or '-'}; peak memory {memory or '-'}"


def placements_table(
    placements: Iterable[zone_pb2.Placement], now_unix: float, *, units: bool = False
) -> Table:
    """One row per subjob; ``units`` (atomized jobs) shows its units and what its checkpoint
    covered instead of the gang member and try."""
    table = Table(title="subjobs", title_justify="left")
    middle = ("units", "done") if units else ("member", "try")
    columns = ("subjob", *middle, "agent", "slices", "state", "cause", "exit", "started", "ran")
    for column in columns:
        table.add_column(column, no_wrap=column in ("subjob", "slices"))
    table.add_column("reason", overflow="fold")
    for placement in placements:
        ran = placement.run_seconds
        if not ran and placement.started_unix:
            end = placement.ended_unix or now_unix
            ran = end - placement.started_unix
        ended = placement.state in ENDED_SUBJOB_STATES
        first = (
            (
                f"{placement.unit_start}..{placement.unit_start + placement.unit_count - 1}",
                str(placement.units_done) if ended else "-",
            )
            if units
            else (str(placement.member), str(placement.attempt))
        )
        table.add_row(
            placement.subjob_id,
            *first,
            placement.agent_id,
            ",".join(placement.slice_ids) or "cpu",
            subjob_state_name(placement.state),
            end_cause_name(placement.end_cause),
            str(placement.exit_code) if ended else "-",
            clock(placement.started_unix, now_unix),
            span(ran) if placement.started_unix else "-",
            Text(placement.reason),
        )
    return table


def shapes_text(summary: common_pb2.AgentSummary) -> str:
    """Free/total per shape: ``gpu:H100-80GB 1/2, mig:3g.40gb 0/1``."""
    parts = []
    for shape in summary.shapes:
        part = f"{shape.shape} {shape.free}/{shape.total}"
        if shape.shape.startswith("share:") and shape.max_free_milli:
            part += f" (max {shape.max_free_milli / 1000:g})"
        parts.append(part)
    return ", ".join(parts) or "-"


def agents_table(agents: Sequence[zone_pb2.AgentInfo], now_unix: float) -> Table:
    agents = [printable(a) for a in agents]
    table = Table(
        title=f"{len(agents)} agent{'s' if len(agents) != 1 else ''}", title_justify="left"
    )
    for column in ("agent", "host", "address", "state", "gpus", "running", "pressure", "seen"):
        table.add_column(column, no_wrap=column in ("agent", "address"))
    table.add_column("free / total", overflow="fold")
    for agent in agents:
        state = zone_pb2.AgentState.Name(agent.state).removeprefix("AGENT_").lower()
        summary = agent.summary
        running = str(summary.running_subjobs)
        if summary.suspended_subjobs:
            running += f" (+{summary.suspended_subjobs} suspended)"
        table.add_row(
            agent.agent_id,
            agent.hostname or summary.hostname or "-",
            agent.address,
            Text(
                state, style={"ready": "green", "stale": "red", "draining": "yellow"}.get(state, "")
            ),
            gpus_text(summary),
            running,
            pressure_name(summary.pressure),
            relative(agent.last_heartbeat_unix, now_unix) if agent.last_heartbeat_unix else "never",
            shapes_text(summary),
        )
    return table


def gpus_text(summary: common_pb2.AgentSummary) -> Text:
    """An agent's GPU count, and how many it holds back from new work (failed: an Xid or
    off the bus; degraded: NVML calls fail): the reasons are in ``laminar inventory``."""
    text = Text(str(summary.total_gpus))
    failed = sum(1 for gpu in summary.degraded_gpus if gpu.failed)
    degraded = len(summary.degraded_gpus) - failed
    held = [f"{n} {what}" for n, what in ((failed, "failed"), (degraded, "degraded")) if n]
    if held:
        text.append(f" ({', '.join(held)})", style="red")
    return text


def pressure_name(level: int) -> str:
    if level == common_pb2.PRESSURE_LEVEL_UNSPECIFIED:
        return "-"
    if level == common_pb2.CRITICAL_PRESSURE:
        return "critical"
    return common_pb2.PressureLevel.Name(level).lower()


def probe_table(
    reply: zone_pb2.ProbeJobReply, *, show_leases: bool, now_unix: float
) -> RenderableType:
    reply = printable(reply)
    fitting = sum(1 for host in reply.hosts if host.fits)
    header = Text(
        f"{fitting} of {len(reply.hosts)} probed host(s) could take it now; "
        f"{reply.hosts_matching} of {reply.hosts_total} host(s) match the shape"
    )
    table = Table()
    for column in ("agent", "address", "fits", "score"):
        table.add_column(column, no_wrap=True)
    table.add_column("reason", overflow="fold")
    if show_leases:
        table.add_column("lease", no_wrap=True)
    for host in sorted(reply.hosts, key=lambda h: (not h.fits, -h.score, h.agent_id)):
        row: list[RenderableType] = [
            host.agent_id,
            host.address,
            Text("yes", style="green") if host.fits else Text("no", style="red"),
            f"{host.score:.3f}" if host.fits else "-",
            Text(host.reason),
        ]
        if show_leases:
            lease = host.lease
            row.append(
                f"{lease.lease_id} on {','.join(lease.slice_ids)}, expires "
                f"{relative(lease.expires_unix, now_unix)}"
                if lease.lease_id
                else "-"
            )
        table.add_row(*row)
    return Group(header, table)


def airlock_view(agent: str, state: agent_pb2.AirlockState, now_unix: float) -> RenderableType:
    state = printable(state)
    header = Text(
        f"{agent}: host pressure {pressure_name(state.host_level)}, host memory "
        f"{format_size(state.host_memory_used_bytes)} of {format_size(state.host_memory_total_bytes)}"
        + (" (dry run: actions are recorded, not taken)" if state.dry_run else "")
    )
    levels = Table(title="slices", title_justify="left")
    for column in ("slice", "level", "used", "total", "used %"):
        levels.add_column(column, no_wrap=column == "slice")
    for level in state.slices:
        ratio = level.used_bytes / level.total_bytes if level.total_bytes else 0.0
        levels.add_row(
            level.slice_id,
            pressure_name(level.level),
            format_size(level.used_bytes),
            format_size(level.total_bytes),
            f"{100 * ratio:.1f}",
        )
    parts: list[RenderableType] = [header, levels]
    suspended = Table(title=f"suspended subjobs ({len(state.suspended)})", title_justify="left")
    for column in ("subjob", "job", "class", "slices", "suspended for"):
        suspended.add_column(column)
    for subjob in state.suspended:
        suspended.add_row(
            subjob.spec.subjob_id,
            subjob.spec.job_id,
            priority_name(subjob.spec.priority),
            ",".join(subjob.slice_ids),
            span(subjob.suspended_seconds),
        )
    parts.append(suspended)
    actions = Table(title=f"recent actions ({len(state.recent_actions)})", title_justify="left")
    for column in ("when", "step", "subjob", "slice", "freed"):
        actions.add_column(column, no_wrap=True)
    actions.add_column("reason", overflow="fold")
    for action in state.recent_actions:
        actions.add_row(
            clock(action.at_unix, now_unix),
            action.step + (" (dry run)" if action.dry_run else ""),
            action.subjob_id,
            action.slice_id,
            format_size(action.bytes_freed) if action.bytes_freed else "-",
            Text(action.reason),
        )
    parts.append(actions)
    return Group(*parts)


#: Seconds per hour and bytes per GiB, for the usage table's human units.
_HOUR_SECONDS = 3600.0
_GIB_BYTES = float(1 << 30)


def usage_table(
    records: Sequence[zone_pb2.UsageRecord], since_unix: float, now_unix: float
) -> Table:
    """GPU-hours per tenant and slice kind, with a total row when there is more than one."""
    records = [printable(r) for r in records]
    window = "all time" if since_unix <= 0 else f"since {clock(since_unix, now_unix)}"
    table = Table(title=f"usage ({window})", title_justify="left")
    table.add_column("tenant")
    table.add_column("slice kind")
    for name in ("subjobs", "GPU-hours", "GPU-mem GiB-hours", "lost GPU-hours"):
        table.add_column(name, justify="right")

    def cells(subjobs: int, gpu_s: float, mem_bs: float, lost_s: float) -> list[str]:
        return [
            str(subjobs),
            f"{gpu_s / _HOUR_SECONDS:.3f}",
            f"{mem_bs / _GIB_BYTES / _HOUR_SECONDS:.3f}",
            f"{lost_s / _HOUR_SECONDS:.3f}",
        ]

    for r in records:
        table.add_row(
            r.tenant,
            r.slice_kind,
            *cells(r.subjobs, r.gpu_seconds, r.gpu_memory_byte_seconds, r.lost_gpu_seconds),
        )
    if len(records) > 1:
        table.add_section()
        table.add_row(
            "total",
            "",
            *cells(
                sum(r.subjobs for r in records),
                sum(r.gpu_seconds for r in records),
                sum(r.gpu_memory_byte_seconds for r in records),
                sum(r.lost_gpu_seconds for r in records),
            ),
        )
    if not records:
        table.caption = "no usage recorded in this window"
    return table


def _json_format() -> Any:
    """protobuf's JSON printer, imported on first use (only -o json needs it)."""
    from google.protobuf import json_format

    return json_format
