"""Job commands: submit, jobs, job, cancel, logs, watch, probe (all through a zone router)."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.causes import TERMINAL_JOB_STATES
from laminar_base.errors import InvalidArgument
from laminar_cli.jobspec import SpecInput, apply_flags, build_spec, read_job_file
from laminar_cli.lazy import lazy_module
from laminar_cli.zoneclient import (
    RPC_TIMEOUT_SECONDS,
    list_jobs,
    one_line,
    output_options,
    zone_options,
    zone_stub,
)

if TYPE_CHECKING:
    from rich.console import Console

    from laminar_cli import render
else:
    render = lazy_module("laminar_cli.render")  # submit prints a job id: no rich, no tables

T = TypeVar("T")

#: How often `logs -f` asks for more output when there was none.
FOLLOW_POLL_SECONDS = 0.5
#: How long `watch` keeps reconnecting to a router that went away before giving up.
WATCH_RECONNECT_SECONDS = 30.0
#: Exit code of `watch` and `submit --wait` when the job did not succeed.
EXIT_JOB_FAILED = 1

# (file key, flag) for the flags that map one-to-one onto job-file keys.
_SPEC_FLAGS = (
    ("resources.gpus", "--gpus"),
    ("resources.mig", "--mig"),
    ("resources.gpu_milli", "--gpu-milli"),
    ("resources.gpu_mem", "--gpu-mem"),
    ("resources.gpu_model", "--gpu-model"),
    ("resources.cpus", "--cpus"),
    ("resources.mem", "--mem"),
    ("priority", "--priority"),
    ("lifecycle", "--lifecycle"),
    ("tenant", "--tenant"),
    ("name", "--name"),
    ("gang", "--gang"),
    ("after", "--after"),
    ("retries", "--retries"),
    ("workdir", "--workdir"),
    ("expected", "--expected"),
    ("time", "--time"),
    ("grace", "--grace"),
    ("restartable", "--restartable"),
    ("run_through_partitions", "--run-through-partitions"),
    ("array", "--array"),
)


#: The router names JobSpec fields (``spec.resources.mig_profile``); these differ from
#: the job-file key (``resources.mig``) the flag table above uses.
_SPEC_FIELD_KEYS = {
    "resources.mig_profile": "resources.mig",
    "resources.gpu_memory_bytes": "resources.gpu_mem",
    "resources.cpu_milli": "resources.cpus",
    "resources.host_memory_bytes": "resources.mem",
    "gang_size": "gang",
    "max_retries": "retries",
    "expected_seconds": "expected",
    "time_limit_seconds": "time",
    "grace_seconds": "grace",
}


def _dest(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


def add_spec_flags(parser: argparse.ArgumentParser, *, full: bool) -> None:
    """The job-shape flags; ``full`` adds the ones only a real submission needs."""
    parser.add_argument("-f", "--file", help="TOML job file (flags override its values)")
    shape = parser.add_argument_group("resources (per gang member)")
    shape.add_argument("--gpus", metavar="N", help="whole GPUs on one host")
    shape.add_argument("--mig", metavar="PROFILE", help="one MIG instance, e.g. 3g.40gb")
    shape.add_argument("--gpu-milli", metavar="M", help="a share of a shared GPU, 1..1000")
    shape.add_argument("--gpu-mem", metavar="SIZE", help="peak GPU memory, e.g. 20GiB")
    shape.add_argument("--gpu-model", metavar="MODEL", help="only this GPU model, e.g. H100-80GB")
    shape.add_argument(
        "--cpus",
        metavar="N",
        help="host CPU cores, e.g. 4 or 0.5 (default: the host's CPUs in proportion to the "
        "GPU share taken)",
    )
    shape.add_argument(
        "--mem",
        metavar="SIZE",
        help="host memory, e.g. 8GiB (default: the host's memory in proportion to the GPU "
        "share taken)",
    )
    parser.add_argument(
        "--priority", metavar="CLASS", help="critical, production, batch (default), opportunistic"
    )
    parser.add_argument("--tenant", help="owner of the job")
    parser.add_argument("--gang", metavar="N", help="members placed all-or-nothing")
    if not full:
        return
    parser.add_argument("--lifecycle", metavar="CLASS", help="resident, long (default), transient")
    parser.add_argument("--name", help="job name (default: the program name)")
    parser.add_argument(
        "--after", action="append", metavar="ID[,ID]", help="start after these jobs succeed"
    )
    parser.add_argument("--retries", metavar="N", help="retries of failed subjobs")
    parser.add_argument(
        "--array",
        metavar="SPEC",
        help="a job array, e.g. 0-999%%50 (Slurm's syntax: indices, ranges A-B[:STEP], "
        "%%N elements under way at once); each element JOB_INDEX sees LAMINAR_ARRAY_INDEX",
    )
    parser.add_argument(
        "--env", action="append", default=[], metavar="K=V", help="environment variable"
    )
    parser.add_argument("--workdir", help="working directory of the command on the host")
    parser.add_argument("--expected", metavar="DURATION", help="expected run time, e.g. 10m")
    parser.add_argument(
        "-t",
        "--time",
        metavar="DURATION",
        help="time limit of each run, e.g. 2h (Slurm's --time): past it the job is stopped "
        "and fails without a retry",
    )
    parser.add_argument("--grace", metavar="DURATION", help="SIGTERM to SIGKILL, e.g. 30s")
    parser.add_argument(
        "--restartable",
        action="store_const",
        const=True,
        default=None,
        help="can restart from its checkpoint",
    )
    parser.add_argument(
        "--run-through-partitions",
        action="store_const",
        const=True,
        default=None,
        help="keep running while the host is out of touch with the router (needs "
        "--restartable; a retry elsewhere may then overlap it: at-least-once)",
    )


def spec_from_args(args: argparse.Namespace, *, require_command: bool) -> zone_pb2.JobSpec:
    """Job file (if any) < flags < the command after ``--``; InvalidArgument names the culprit."""
    base = read_job_file(args.file) if args.file else SpecInput()
    flags: dict[str, tuple[str, Any]] = {
        key: (flag, getattr(args, _dest(flag), None)) for key, flag in _SPEC_FLAGS
    }
    command = list(getattr(args, "command", None) or [])
    if command and command[0] == "--":
        command = command[1:]
    if command:
        flags["command"] = ("command", command)
    data = apply_flags(base, flags, getattr(args, "env", None) or [])
    return build_spec(data, require_command=require_command)


# ---------------------------------------------------------------- forwarded jobs


@dataclass(frozen=True)
class Located:
    """Where a job really lives: a router forwards a job at most once, to a peer zone."""

    address: str
    job: zone_pb2.Job
    origin: zone_pb2.Job | None = None  # the forwarding router's record, when forwarded


def forwarded_target(job: zone_pb2.Job) -> tuple[str, str, str] | None:
    """(zone, address, job id) of a FORWARDED job, from ``forwarded_to = ZONE@HOST:PORT/JOB``."""
    if job.state != zone_pb2.FORWARDED or not job.forwarded_to:
        return None
    zone, _, rest = job.forwarded_to.partition("@")
    address, _, job_id = rest.rpartition("/")
    if not address or not job_id:
        return None
    return zone, address, job_id


def locate_job(address: str, job_id: str) -> Located:
    """Read a job, following it to the peer zone when its router forwarded it."""
    request = zone_pb2.GetJobRequest(job_id=job_id)
    with zone_stub(address) as stub:
        job = stub.GetJob(request, timeout=RPC_TIMEOUT_SECONDS)
    target = forwarded_target(job)
    if target is None:
        return Located(address, job)
    _, peer, remote_id = target
    remote_request = zone_pb2.GetJobRequest(job_id=remote_id)
    with zone_stub(peer) as stub:
        remote = stub.GetJob(remote_request, timeout=RPC_TIMEOUT_SECONDS)
    return Located(peer, remote, origin=job)


def _forwarded_line(origin: zone_pb2.Job, located: Located) -> str:
    zone = origin.forwarded_to.partition("@")[0]
    return (
        f"{origin.job_id} was forwarded by zone {origin.zone or '?'} to zone {zone} at "
        f"{located.address}, where it is {located.job.job_id}"
    )


# ---------------------------------------------------------------- commands


def cmd_submit(args: argparse.Namespace, console: Console) -> int:
    spec = spec_from_args(args, require_command=True)
    if not spec.workdir:
        # Like sbatch: the command runs where it was submitted from (relative paths in it
        # then mean what they meant here), unless --workdir says otherwise.
        spec.workdir = os.getcwd()
    request_id = args.request_id or os.urandom(16).hex()  # not uuid: it imports platform
    request = zone_pb2.SubmitRequest(spec=spec, client_request_id=request_id)
    if args.wait:
        return _submit_and_wait(args, request)
    with zone_stub(args.zone_address) as stub:
        # The request id makes a resend safe: a router that took the first one (and then
        # restarted before answering) returns the same job.
        try:
            job = stub.Submit(request, timeout=RPC_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            raise _as_flag_error(exc, args) from None
    if args.output == "json":
        print(render.to_json(job))
    else:
        print(job.job_id)
    _say_if_too_large(job)
    return 0


def _say_if_too_large(job: zone_pb2.Job) -> None:
    if job.reason_code == zone_pb2.REASON_TOO_LARGE:
        # Accepted (more hosts may join), but say so now rather than let it wait unseen;
        # stdout stays the job id alone for scripts.
        shown = render.printable(job)
        token = render.reason_token(job.reason_code)
        print(f"laminar: {shown.job_id} waits: [{token}] {shown.reason}", file=sys.stderr)


def _submit_and_wait(args: argparse.Namespace, request: zone_pb2.SubmitRequest) -> int:
    """``submit --wait`` (sbatch --wait): the job id at once, then block until the job
    ends; 0 if it succeeded, 1 if not (its end state and reason on stderr). Ctrl-C stops
    the waiting, never the job."""
    events = submitted_events(args.zone_address, request)
    try:
        submitted = next(events)
    except grpc.RpcError as exc:
        raise _as_flag_error(exc, args) from None
    if args.output != "json":
        print(submitted.job_id, flush=True)
    _say_if_too_large(submitted)
    last = submitted
    try:
        for job in events:
            last = job
    except KeyboardInterrupt:
        print(
            f"laminar: stopped waiting; {submitted.job_id} keeps running "
            f"(laminar watch {submitted.job_id} follows it, laminar cancel stops it)",
            file=sys.stderr,
        )
        raise  # main's exit code for an interrupt (130)
    if args.output == "json":
        print(render.to_json(last))
    if last.state == zone_pb2.JOB_SUCCEEDED:
        return 0
    shown = render.printable(last)  # the reason may hold the program's own text
    state = render.job_state_name(shown.state)
    print(
        f"laminar: {submitted.job_id} {state}"
        + (f": {one_line(shown.reason)}" if shown.reason else ""),
        file=sys.stderr,
    )
    return EXIT_JOB_FAILED


def _as_flag_error(exc: grpc.RpcError, args: argparse.Namespace) -> Exception:
    """The router refused a field of the spec: name the flag the user gave for it (or its
    job-file key), as the CLI's own checks do."""
    details = (exc.details() if hasattr(exc, "details") else None) or ""
    field, sep, message = details.partition(": ")
    if exc.code() != grpc.StatusCode.INVALID_ARGUMENT or not sep:
        return exc
    key = field.removeprefix("spec.")
    key = _SPEC_FIELD_KEYS.get(key, key)
    flag = dict(_SPEC_FLAGS).get(key)
    if flag is not None and getattr(args, _dest(flag), None) is not None:
        return InvalidArgument(message, field=flag)
    return InvalidArgument(message, field=key if key != field else field)


def _parse_states(text: str | None) -> list[zone_pb2.JobState]:
    if not text:
        return []
    states = []
    for name in (part.strip().lower() for part in text.split(",")):
        if name not in render.JOB_STATE_NAMES:
            raise InvalidArgument(
                f"unknown state {name!r}; expected {', '.join(render.JOB_STATE_NAMES)}",
                field="--state",
            )
        states.append(render.JOB_STATE_NAMES[name])
    return states


#: `laminar jobs --sort FIELD`: ascending; the default is newest first (as listed).
SORT_KEYS: dict[str, Callable[[zone_pb2.Job], Any]] = {
    "job": lambda j: j.job_id,
    "name": lambda j: (j.spec.name, j.job_id),
    "tenant": lambda j: (j.spec.tenant, j.job_id),
    "state": lambda j: (render.job_state_name(j.state), j.job_id),
    "class": lambda j: (j.spec.priority or 3, j.job_id),
    "age": lambda j: -j.submitted_unix,
    "submitted": lambda j: j.submitted_unix,
}

#: Jobs `laminar jobs` shows without --limit (newest first).
DEFAULT_JOBS_SHOWN = 1000


def cmd_jobs(args: argparse.Namespace, console: Console) -> int:
    if args.limit is not None and args.limit < 0:
        raise InvalidArgument("must not be negative", field="--limit")
    wanted = args.limit or DEFAULT_JOBS_SHOWN
    request = zone_pb2.ListJobsRequest(
        tenant=args.tenant or "", states=_parse_states(args.state), limit=wanted
    )
    if args.sort and args.sort not in SORT_KEYS:
        raise InvalidArgument(f"must be one of {', '.join(SORT_KEYS)}", field="--sort")
    if args.watch is not None and not 0.2 <= args.watch <= 3600:
        raise InvalidArgument("must be between 0.2 and 3600 seconds", field="--watch")
    with zone_stub(args.zone_address) as stub:
        while True:
            jobs = list_jobs(stub, request, wanted)
            if args.sort:
                jobs.sort(key=SORT_KEYS[args.sort])
            reply = zone_pb2.ListJobsReply(jobs=jobs)
            if args.output == "json":
                print(render.to_json(reply), flush=True)
            else:
                if args.watch is not None and console.is_terminal:
                    console.clear()
                wide = args.output == "wide"
                table = render.jobs_table(
                    jobs,
                    time.time(),
                    wide=wide,
                    headers=not args.no_headers,
                    width=console.width,
                )
                # -o wide: whole cells, however long the lines get (as kubectl's)
                from rich.console import Console

                out = Console(width=10_000, no_color=console.no_color) if wide else console
                out.print(table)
            if args.watch is None:
                return 0
            time.sleep(args.watch)  # --watch: list again every N seconds until Ctrl-C


def cmd_job(args: argparse.Namespace, console: Console) -> int:
    located = locate_job(args.zone_address, args.job_id)
    if args.output == "json":
        print(render.to_json(located.job))
        return 0
    if located.origin is not None:
        console.print(_forwarded_line(located.origin, located), highlight=False)
    console.print(render.job_detail(located.job, time.time()))
    return 0


def cmd_cancel(args: argparse.Namespace, console: Console) -> int:
    """Cancel each job named, in order; one that cannot be cancelled (unknown id, refused)
    is reported on stderr and the others are still cancelled (exit 1 if any was not)."""
    cancelled: list[zone_pb2.Job] = []
    failed = 0
    for job_id in dict.fromkeys(args.job_ids):  # each once, in the order given
        try:
            located = locate_job(args.zone_address, job_id)
            request = zone_pb2.CancelJobRequest(job_id=located.job.job_id, reason=args.reason or "")
            with zone_stub(located.address) as stub:
                # Cancelling twice is harmless (an ended job stays as it ended): resend is safe.
                job = stub.CancelJob(request, timeout=RPC_TIMEOUT_SECONDS)
        except grpc.RpcError as exc:
            if len(args.job_ids) == 1 or exc.code() not in _PER_JOB_CODES:
                raise  # one job, or the router itself failed: main's one-line error
            failed += 1
            print(f"laminar: {job_id}: {one_line(exc.details() or '')}", file=sys.stderr)
            continue
        cancelled.append(job)
        if args.output != "json":
            console.print(f"{job.job_id}: {render.job_state_name(job.state)}")
    if args.output == "json":
        if len(args.job_ids) == 1:
            print(render.to_json(cancelled[0]))
        else:
            print("[" + ",\n".join(render.to_json(job) for job in cancelled) + "]")
    return 1 if failed else 0


#: Errors that concern one job of several named to ``cancel``: reported, the rest go on.
_PER_JOB_CODES = frozenset(
    {
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


def _write_bytes(data: bytes) -> None:
    sys.stdout.flush()
    buffer = getattr(sys.stdout, "buffer", None)
    if buffer is not None:
        buffer.write(data)
        buffer.flush()
    else:  # a text-only stream (some test harnesses)
        sys.stdout.write(data.decode(errors="replace"))
        sys.stdout.flush()


def _has_ended(stub: zone_pb2_grpc.ZoneStub, job_id: str) -> bool:
    job = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS)
    return job.state in render.TERMINAL_JOB_STATES


def cmd_logs(args: argparse.Namespace, console: Console) -> int:
    stream = "stderr" if args.stderr else "stdout"
    offset = 0
    located = locate_job(args.zone_address, args.job_id)
    job_id = located.job.job_id
    with zone_stub(located.address) as stub:
        while True:
            request = zone_pb2.GetLogsRequest(
                job_id=job_id, subjob_id=args.subjob or "", stream=stream, offset=offset
            )
            try:
                reply = stub.GetLogs(request, timeout=RPC_TIMEOUT_SECONDS)
            except grpc.RpcError as exc:
                # `-f` on a job that has not started yet waits for it to start.
                not_started = exc.code() == grpc.StatusCode.FAILED_PRECONDITION
                if not (args.follow and not_started) or _has_ended(stub, job_id):
                    raise
                time.sleep(FOLLOW_POLL_SECONDS)
                continue
            if reply.data:
                _write_bytes(reply.data)
            offset = reply.next_offset if reply.next_offset > offset else offset + len(reply.data)
            if reply.eof:
                return 0
            if not reply.data:
                if not args.follow:
                    return 0
                time.sleep(FOLLOW_POLL_SECONDS)


def _event_line(job: zone_pb2.Job, at_unix: float) -> str:
    job = render.printable(job)
    now = time.time()
    state = render.job_state_name(job.state)
    line = f"{render.clock(at_unix or now, now)}  {job.job_id}  {state}"
    if job.state in (zone_pb2.JOB_RUNNING, zone_pb2.JOB_SUSPENDED):
        line += f" on {render.where(job)}"
    if job.state in (zone_pb2.PENDING, zone_pb2.QUEUED, zone_pb2.WAITING):
        if job.reason:
            line += f": {job.reason}"
        if job.expected_start_unix > 0:
            line += f" (expected start {render.expected_start(job, now)})"
    elif job.state in render.TERMINAL_JOB_STATES:
        line += f" after {render.span(render.ran_seconds(job, now))}"
        if job.reason:
            line += f": {job.reason}"
    elif job.state == zone_pb2.FORWARDED:
        line += f": {job.reason or job.forwarded_to}"
    return line


def _watch_one(stub: zone_pb2_grpc.ZoneStub, job_id: str) -> Iterator[tuple[zone_pb2.Job, float]]:
    """One router's events for a job until it ends there; reconnects while the router restarts."""
    gave_up_at = 0.0
    while True:
        try:
            for event in stub.WatchJob(zone_pb2.WatchJobRequest(job_id=job_id)):
                gave_up_at = 0.0
                yield event.job, event.at_unix
                if event.job.state in _ENDS_HERE:
                    return
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            now = time.monotonic()
            gave_up_at = gave_up_at or now + WATCH_RECONNECT_SECONDS
            if now > gave_up_at:
                raise
            time.sleep(1.0)  # the router is restarting; try again
            continue
        # The stream ended without a final state: read the job once and go again.
        job = stub.GetJob(zone_pb2.GetJobRequest(job_id=job_id), timeout=RPC_TIMEOUT_SECONDS)
        if job.state in _ENDS_HERE:
            yield job, time.time()
            return


#: States after which a router sends no more events for a job.
_ENDS_HERE = TERMINAL_JOB_STATES
#: SubmitAndWatch failures before its first event that Submit (+ WatchJob) takes over.
_SUBMIT_AGAIN_CODES = frozenset({grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE})


def watch_events(address: str, job_id: str) -> Iterator[tuple[zone_pb2.Job, float]]:
    """A job's events until it ends, following it once to a peer zone if it is forwarded."""
    with zone_stub(address) as stub:
        last: zone_pb2.Job | None = None
        for job, at_unix in _watch_one(stub, job_id):
            last = job
            yield job, at_unix
    if last is not None:
        yield from _follow_forwarded(last)


def _follow_forwarded(job: zone_pb2.Job) -> Iterator[tuple[zone_pb2.Job, float]]:
    """The peer zone's events for a job its router forwarded there; none for another job."""
    target = forwarded_target(job)
    if target is None:
        return
    _, peer, remote_id = target
    with zone_stub(peer) as stub:
        yield from _watch_one(stub, remote_id)


def submitted_events(address: str, request: zone_pb2.SubmitRequest) -> Iterator[zone_pb2.Job]:
    """Submit a job and follow it until it ends, in one SubmitAndWatch call: first the job
    as Submit answers it (an error from the submit itself is raised by the first ``next``),
    then each change, following it once to a peer zone if it is forwarded.

    An older router (UNIMPLEMENTED) gets Submit + :func:`watch_events`; so does one that
    is unavailable (Submit is resent while it restarts, as without --wait), and a stream
    cut after the submit, whatever its status (the watch reconnects). The request id makes Submit after a
    SubmitAndWatch that may have reached the router return the same job."""
    last: zone_pb2.Job | None = None
    with zone_stub(address) as stub:
        try:
            for event in stub.SubmitAndWatch(request):
                last = event.job
                yield last
        except grpc.RpcError as exc:
            if last is None and exc.code() not in _SUBMIT_AGAIN_CODES:
                raise  # the submit itself was refused
            # After the job was accepted any cut of the stream is followed by a watch,
            # which reconnects while the router restarts and raises what persists.
        if last is None:  # a router without SubmitAndWatch, or one that is restarting
            last = stub.Submit(request, timeout=RPC_TIMEOUT_SECONDS)  # resent while unavailable
            yield last
    if last.state not in _ENDS_HERE:  # the old path, or the stream was cut: watch it
        yield from (job for job, _ in watch_events(address, last.job_id))
    else:
        yield from (job for job, _ in _follow_forwarded(last))


def cmd_watch(args: argparse.Namespace, console: Console) -> int:
    last: zone_pb2.Job | None = None
    last_line = ""
    for job, at_unix in watch_events(args.zone_address, args.job_id):
        last = job
        if args.output == "json":
            print(
                _json_format().MessageToJson(
                    zone_pb2.JobEvent(job=job, at_unix=at_unix),
                    preserving_proto_field_name=True,
                    indent=None,
                ),
                flush=True,
            )
            continue
        line = _event_line(job, at_unix)
        if line.split("  ", 1)[-1] != last_line.split("  ", 1)[-1]:
            console.print(line, highlight=False)
            last_line = line
    if last is None:
        return EXIT_JOB_FAILED
    return 0 if last.state == zone_pb2.JOB_SUCCEEDED else EXIT_JOB_FAILED


def cmd_probe(args: argparse.Namespace, console: Console) -> int:
    spec = spec_from_args(args, require_command=False)
    if args.max_hosts is not None and not 1 <= args.max_hosts <= 1000:
        raise InvalidArgument("must be between 1 and 1000", field="--max-hosts")
    with zone_stub(args.zone_address) as stub:
        reply = stub.ProbeJob(
            zone_pb2.ProbeJobRequest(
                spec=spec, keep_leases=args.keep_leases, max_hosts=args.max_hosts or 0
            ),
            timeout=RPC_TIMEOUT_SECONDS,
        )
    if args.output == "json":
        print(render.to_json(reply))
    else:
        console.print(render.probe_table(reply, show_leases=args.keep_leases, now_unix=time.time()))
    return 0


# ---------------------------------------------------------------- parsers


def register(sub: argparse._SubParsersAction[Any]) -> None:
    zone, output = zone_options(), output_options()
    submit = sub.add_parser(
        "submit",
        parents=[zone, output],
        help="submit a job: flags and/or -f job.toml, then -- COMMAND ...",
        description="Prints the job id (the Job as JSON with -o json). With --wait, then "
        "waits for the job to end (as sbatch --wait): exit 0 if it succeeded, 1 if not; "
        "Ctrl-C stops the waiting (exit 130), not the job.",
    )
    add_spec_flags(submit, full=True)
    submit.add_argument(
        "--wait",
        action="store_true",
        help="block until the job ends; exit 0 if it succeeded, 1 if not (-o json: the final job)",
    )
    submit.add_argument(
        "--request-id", help="idempotency key: resubmitting with it returns the same job"
    )
    submit.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARG...]")
    submit.set_defaults(func=cmd_submit)

    jobs = sub.add_parser("jobs", parents=[zone, output], help="list jobs")
    jobs.add_argument("--tenant")
    jobs.add_argument("--state", metavar="S[,S]", help="e.g. running,queued")
    jobs.add_argument("--limit", type=int, metavar="N")
    jobs.add_argument("--sort", metavar="FIELD", help=f"one of {', '.join(SORT_KEYS)}")
    jobs.add_argument(
        "--watch",
        nargs="?",
        const=2.0,
        type=float,
        metavar="SECONDS",
        help="list again every SECONDS (default 2) until Ctrl-C",
    )
    jobs.add_argument("--no-headers", action="store_true", help="rows only, for scripts")
    jobs.set_defaults(func=cmd_jobs)

    job = sub.add_parser(
        "job", parents=[zone, output], help="show one job: state, placement, why waiting"
    )
    job.add_argument("job_id", metavar="ID")
    job.set_defaults(func=cmd_job)

    cancel = sub.add_parser("cancel", parents=[zone, output], help="cancel jobs")
    cancel.add_argument(
        "job_ids", metavar="ID", nargs="+", help="job ids (an array's id cancels it all)"
    )
    cancel.add_argument("--reason")
    cancel.set_defaults(func=cmd_cancel)

    logs = sub.add_parser("logs", parents=[zone], help="print a job's output")
    logs.add_argument("job_id", metavar="ID")
    logs.add_argument("--subjob", metavar="S", help="subjob id (default: the latest)")
    logs.add_argument("--stderr", action="store_true", help="stderr instead of stdout")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing until it ends")
    logs.set_defaults(func=cmd_logs)

    watch = sub.add_parser(
        "watch",
        parents=[zone, output],
        help="stream a job's state changes; exit 0 if it succeeds, 1 if not",
    )
    watch.add_argument("job_id", metavar="ID")
    watch.set_defaults(func=cmd_watch)

    probe = sub.add_parser(
        "probe", parents=[zone, output], help="which hosts could take this job now (dry run)"
    )
    add_spec_flags(probe, full=False)
    probe.add_argument("--max-hosts", type=int, metavar="N", help="hosts to ask (default 8)")
    probe.add_argument(
        "--keep-leases",
        action="store_true",
        help="two-phase form: keep and print the leases (they expire on their own)",
    )
    probe.set_defaults(func=cmd_probe)


def _json_format() -> Any:
    """protobuf's JSON printer, imported on first use (only -o json needs it)."""
    from google.protobuf import json_format

    return json_format
