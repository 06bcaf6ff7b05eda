"""The `laminar` command against a real router and agent processes on loopback.

One cluster per module (a router and two agents); each test submits its own
jobs and waits for them with a deadline, so the tests do not depend on order.
Jobs that must stay running wait for a gate file the test creates.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import psutil
import pytest
from waiting import gate_code, wait_for

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_cli.main import main
from laminar_cli.up import launch

#: host-a: two whole GPUs; host-b: one H100 cut into MIG instances.
AGENTS = {"host-a": "2xA100-40GB", "host-b": "H100-80GB:mig=3g.40gb+2g.20gb+1g.10gb"}
HEARTBEAT_SECONDS = 0.2


@pytest.fixture(scope="module")
def zone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with LocalCluster(tmp_path_factory.mktemp("cluster")) as cluster:
        router = cluster.start_zone("zone-1", heartbeat_seconds=HEARTBEAT_SECONDS)
        for agent_id, spec in AGENTS.items():
            cluster.start_agent(
                agent_id, spec, zone=router.address, heartbeat_seconds=HEARTBEAT_SECONDS
            )
        cluster.wait_registered()
        yield router.address


class Cli:
    """Runs ``laminar`` in-process against the module's router and captures its output."""

    def __init__(self, address: str, capsys: pytest.CaptureFixture[str]) -> None:
        self.address = address
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, str, str]:
        self.capsys.readouterr()
        code = main(["--zone", self.address, *argv])
        captured = self.capsys.readouterr()
        return code, captured.out, captured.err

    def ok(self, *argv: str) -> str:
        code, out, err = self(*argv)
        assert code == 0, f"laminar {' '.join(argv)} exited {code}: {err}"
        return out

    def json(self, command: str, *argv: str) -> Any:
        return json.loads(self.ok(command, "-o", "json", *argv))

    def submit(self, *argv: str) -> str:
        out = self.ok("submit", *argv)
        job_id = out.strip()
        assert job_id and len(out.splitlines()) == 1, out  # the id alone on stdout
        return job_id


@pytest.fixture
def cli(zone: str, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(zone, capsys)


def _state(address: str, job_id: str) -> zone_pb2.Job:
    with grpc.insecure_channel(address) as channel:
        return zone_pb2_grpc.ZoneStub(channel).GetJob(
            zone_pb2.GetJobRequest(job_id=job_id), timeout=10
        )


def _in_the_foreground() -> None:
    """The CLI as a terminal starts it, Ctrl-C delivered: a suite run in the background by
    a non-interactive shell (``make test &``) ignores SIGINT, and children inherit that
    (Python then installs no KeyboardInterrupt handler), so these tests would hang there."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _py(code: str) -> list[str]:
    return ["--", sys.executable, "-c", code]


def test_submit_watch_show_and_logs(cli: Cli) -> None:
    job_id = cli.submit(
        "--gpus", "1", "--name", "hello", *_py("print('hello from laminar'); print('line 2')")
    )
    code, out, _ = cli("watch", job_id)
    assert code == 0, out
    assert "succeeded" in out.splitlines()[-1]

    job = cli.json("job", job_id)
    assert job["state"] == "JOB_SUCCEEDED" and job["spec"]["name"] == "hello"
    [placement] = job["placements"]
    assert placement["agent_id"] == "host-a"  # the only host with whole GPUs
    assert placement["slice_ids"] and placement["state"] == "SUCCEEDED"
    assert placement["exit_code"] == 0
    assert job["started_unix"] >= job["submitted_unix"] > 0

    assert cli.ok("logs", job_id) == "hello from laminar\nline 2\n"
    shown = cli.ok("job", job_id)
    assert "succeeded" in shown and "host-a" in shown and job_id in shown

    listed = cli.json("jobs", "--state", "succeeded")
    assert job_id in {j["job_id"] for j in listed["jobs"]}
    assert job_id in cli.ok("jobs")


def test_failed_job_makes_watch_exit_1(cli: Cli) -> None:
    job_id = cli.submit(
        "--mig", "1g.10gb", *_py("import sys; print('oops', file=sys.stderr); sys.exit(3)")
    )
    code, _, _ = cli("watch", job_id)
    assert code == 1
    job = cli.json("job", job_id)
    assert job["state"] == "JOB_FAILED"
    assert job["placements"][-1]["exit_code"] == 3
    assert job["placements"][-1]["agent_id"] == "host-b"  # the only host with MIG
    assert cli.ok("logs", job_id, "--stderr") == "oops\n"


def test_queued_job_says_why_and_runs_once_capacity_frees(
    cli: Cli, zone: str, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    holder = cli.submit("--gpus", "2", "--name", "holder", *_py(gate_code(gate)))
    wait_for(lambda: _state(zone, holder).state == zone_pb2.JOB_RUNNING)
    waiter = cli.submit("--gpus", "2", "--name", "waiter", *_py("print('got both')"))
    wait_for(lambda: _state(zone, waiter).state == zone_pb2.QUEUED)

    job = cli.json("job", waiter)
    assert job["reason"], job  # every waiting job says why
    # ... and with a code scripts can match: only host-a has two whole GPUs, and it is busy
    assert job["reason_code"] == "REASON_RESOURCES", job
    shown = cli.ok("job", waiter)
    assert "queued" in shown and "why waiting" in shown and "expected start" in shown
    assert "[resources]" in shown

    # `logs -f` on a job that has not started waits for it, then prints its output.
    follower = subprocess.Popen(
        [sys.executable, "-m", "laminar_cli.main", "--zone", zone, "logs", "-f", waiter],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    port = int(zone.rsplit(":", 1)[1])

    def follower_connected_or_gone() -> bool:
        if follower.poll() is not None:
            return True
        conns = psutil.Process(follower.pid).net_connections(kind="tcp")
        return any(c.raddr and c.raddr.port == port for c in conns)

    wait_for(follower_connected_or_gone)  # it is asking the router before the job can start
    assert follower.poll() is None, follower.communicate()
    assert _state(zone, waiter).state == zone_pb2.QUEUED
    gate.touch()
    assert cli("watch", waiter)[0] == 0
    out, err = follower.communicate(timeout=30)
    assert (follower.returncode, out) == (0, "got both\n"), err
    assert cli("watch", holder)[0] == 0
    assert cli.ok("logs", waiter) == "got both\n"
    done = cli.json("job", waiter)
    assert done["placements"][0]["agent_id"] == "host-a"
    assert done["started_unix"] >= _state(zone, holder).ended_unix - 1e-3


def test_cancel_and_follow_logs(cli: Cli, zone: str, tmp_path: Path) -> None:
    gate = tmp_path / "never"
    code = "print('started', flush=True)\n" + gate_code(gate)
    job_id = cli.submit("--mig", "3g.40gb", "--lifecycle", "transient", *_py(code))
    wait_for(lambda: _state(zone, job_id).state == zone_pb2.JOB_RUNNING)
    wait_for(lambda: cli.ok("logs", job_id) == "started\n")

    out = cli.ok("cancel", job_id, "--reason", "test says stop")
    assert "cancelled" in out
    code_, out, _ = cli("watch", job_id)
    assert code_ == 1 and "cancelled" in out
    assert cli.json("job", job_id)["state"] == "JOB_CANCELLED"
    # Following the logs of an ended job prints what it wrote and returns.
    assert cli.ok("logs", job_id, "-f") == "started\n"


def test_cancel_several_jobs_goes_on_past_an_unknown_one(cli: Cli, zone: str) -> None:
    """Like scancel: each id named is cancelled; an unknown one is one line on stderr, the
    ones after it are still cancelled, and the exit code says one failed."""
    first = cli.submit("--", "sleep", "600")
    second = cli.submit("--", "sleep", "600")
    code, out, err = cli("cancel", first, "j-nosuchjob", second, first)
    assert code == 1
    assert out.splitlines() == [f"{first}: cancelled", f"{second}: cancelled"]
    assert len(err.splitlines()) == 1 and err.startswith("laminar: j-nosuchjob: ")
    assert {_state(zone, j).state for j in (first, second)} == {zone_pb2.JOB_CANCELLED}
    # Cancelling a cancelled job again is harmless (a resend whose reply was lost); one
    # that ended otherwise is refused by name. With -o json: one JSON list.
    done = cli.submit("--", "true")
    wait_for(lambda: _state(zone, done).state == zone_pb2.JOB_SUCCEEDED)
    third = cli.submit("--", "sleep", "600")
    code, out, err = cli("cancel", "-o", "json", first, done, third)
    assert code == 1 and f"laminar: {done}: " in err and "already ended (job_succeeded)" in err
    assert [j["job_id"] for j in json.loads(out)] == [first, third]


def test_agents_probe_drain_airlock_pressure(cli: Cli) -> None:
    agents = {a["agent_id"]: a for a in cli.json("agents")["agents"]}
    assert set(agents) == set(AGENTS)
    assert all(a["state"] == "AGENT_READY" for a in agents.values())
    assert "host-a" in cli.ok("agents")

    probe = cli.json("probe", "--mig", "2g.20gb")
    fits = {h["agent_id"]: h["fits"] for h in probe["hosts"]}
    assert fits.get("host-b") is True and not fits.get("host-a")
    assert "could take it now" in cli.ok("probe", "--mig", "2g.20gb")

    drained = cli.json("drain", "host-b", "--reason", "maintenance")
    assert drained["agent_id"] == "host-b"
    try:
        wait_for(
            lambda: (
                {a["agent_id"]: a["state"] for a in cli.json("agents")["agents"]}["host-b"]
                == "AGENT_DRAINING"
            )
        )
        probe = cli.json("probe", "--mig", "2g.20gb")
        assert not any(h["fits"] for h in probe["hosts"]), probe
    finally:
        cli.ok("undrain", "host-b")
    wait_for(
        lambda: (
            {a["agent_id"]: a["state"] for a in cli.json("agents")["agents"]}["host-b"]
            == "AGENT_READY"
        )
    )

    out = cli.ok("pressure", "host-a", "--gpu", "1", "--used", "1GiB")
    assert "injected 1.0GiB on host-a GPU 1" in out
    try:
        airlock = cli.json("airlock", "host-a")
        used = sorted(int(s["used_bytes"]) for s in airlock["slices"])  # per device of host-a
        assert len(used) == 2 and used[-1] >= 1024**3, airlock
        assert "host-a: host pressure" in cli.ok("airlock", "host-a")
    finally:
        cli.ok("pressure", "host-a", "--gpu", "1", "--used", "0")


def test_errors_from_the_router_are_one_line(cli: Cli) -> None:
    code, out, err = cli("job", "no-such-job")
    assert code == 1 and out == ""
    assert len(err.strip().splitlines()) == 1 and "NOT_FOUND" in err

    # The CLI leaves the name's length to the router, which refuses it as invalid input;
    # the CLI names the flag the field came from.
    code, out, err = cli("submit", "--name", "n" * 5000, "--gpus", "1", *_py("pass"))
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and err.startswith("laminar: --name: ")
    assert "at most 128" in err

    code, _, err = cli("drain", "no-such-host")
    assert code == 1 and "NOT_FOUND" in err and len(err.strip().splitlines()) == 1


def test_submit_is_idempotent_with_a_request_id(cli: Cli) -> None:
    argv = ["--request-id", "same-request", "--mig", "1g.10gb", *_py("pass")]
    first = cli.submit(*argv)
    assert cli.submit(*argv) == first
    as_json = cli.json("submit", *argv)
    assert as_json["job_id"] == first and as_json["client_request_id"] == "same-request"


# ---------------------------------------------------------------- submit --wait


def test_submit_wait_exits_0_once_the_job_succeeded(cli: Cli) -> None:
    code, out, err = cli("submit", "--wait", "--mig", "1g.10gb", "--", "true")
    assert code == 0, err
    job_id = out.strip()
    assert job_id and len(out.splitlines()) == 1, out  # the id alone, as without --wait
    assert _state(cli.address, job_id).state == zone_pb2.JOB_SUCCEEDED  # it waited
    final = cli.json("submit", "--wait", "--mig", "1g.10gb", "--", "true")
    assert final["state"] == "JOB_SUCCEEDED"  # -o json: the final record


def test_submit_wait_exits_1_naming_how_the_job_ended(cli: Cli) -> None:
    code, out, err = cli("submit", "--wait", "--mig", "1g.10gb", "--", "false")
    job_id = out.strip()
    assert code == 1 and job_id and len(out.splitlines()) == 1, (out, err)
    assert err.startswith(f"laminar: {job_id} failed") and len(err.splitlines()) == 1, err
    assert _state(cli.address, job_id).state == zone_pb2.JOB_FAILED


def test_submit_wait_refused_input_is_one_line_naming_the_flag(cli: Cli) -> None:
    # The router's INVALID_ARGUMENT, in SubmitAndWatch's first answer
    status, out, err = cli("submit", "--wait", "--gpus", "3", *_py("pass"))  # host-a has 2
    assert status == 2 and not out
    assert len(err.strip().splitlines()) == 1 and err.startswith("laminar: --gpus: "), err
    # and the CLI's own check, before anything is sent
    status, out, err = cli("submit", "--wait", "--gpu-mem", "60 gigs", *_py("pass"))
    assert status == 2 and not out and err.startswith("laminar: --gpu-mem: "), err


def test_submit_wait_on_a_router_without_submit_and_watch_still_waits(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older router answers UNIMPLEMENTED: the CLI submits and watches instead."""
    refused: list[grpc.StatusCode] = []

    class OlderRouterStub(zone_pb2_grpc.ZoneStub):
        def __init__(self, channel: grpc.Channel) -> None:
            super().__init__(channel)
            absent = channel.unary_stream(
                "/laminar.v1.Zone/SubmitAndWatchAbsent",  # a method the real router lacks
                request_serializer=zone_pb2.SubmitRequest.SerializeToString,
                response_deserializer=zone_pb2.JobEvent.FromString,
            )

            def submit_and_watch(request: zone_pb2.SubmitRequest) -> Iterator[Any]:
                try:
                    yield from absent(request)
                except grpc.RpcError as exc:
                    refused.append(exc.code())
                    raise

            self.SubmitAndWatch = submit_and_watch

    monkeypatch.setattr(zone_pb2_grpc, "ZoneStub", OlderRouterStub)
    code, out, err = cli("submit", "--wait", "--mig", "1g.10gb", *_py("pass"))
    assert refused == [grpc.StatusCode.UNIMPLEMENTED]
    assert code == 0, err
    assert _state(cli.address, out.strip()).state == zone_pb2.JOB_SUCCEEDED
    code, out, err = cli("submit", "--wait", "--mig", "1g.10gb", "--", "false")
    assert code == 1 and f"{out.strip()} failed" in err, err


def test_submit_wait_goes_on_watching_after_a_stream_cut_with_any_status(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A SubmitAndWatch stream that breaks after the job was accepted (here INTERNAL after
    its first event) is followed by a watch: the CLI still waits for the job's real end
    and does not submit it again."""

    class _Cut(grpc.RpcError):
        def code(self) -> grpc.StatusCode:
            return grpc.StatusCode.INTERNAL

        def details(self) -> str:
            return "stream cut"

    cut: list[str] = []

    class CuttingStub(zone_pb2_grpc.ZoneStub):
        def __init__(self, channel: grpc.Channel) -> None:
            super().__init__(channel)
            whole = self.SubmitAndWatch

            def submit_and_watch(request: zone_pb2.SubmitRequest) -> Iterator[Any]:
                for event in whole(request):
                    cut.append(event.job.job_id)
                    yield event
                    raise _Cut()

            self.SubmitAndWatch = submit_and_watch

    monkeypatch.setattr(zone_pb2_grpc, "ZoneStub", CuttingStub)
    code, out, err = cli("submit", "--wait", "--mig", "1g.10gb", "--", "false")
    assert cut == [out.strip()]
    assert code == 1 and f"{out.strip()} failed" in err, err
    assert _state(cli.address, out.strip()).state == zone_pb2.JOB_FAILED


def test_ctrl_c_stops_submit_wait_and_leaves_the_job_running(cli: Cli, tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    out, err = tmp_path / "wait.out", tmp_path / "wait.err"
    argv = ["--zone", cli.address, "submit", "--wait", "--mig", "1g.10gb"]
    argv += _py(gate_code(gate))
    with out.open("w") as stdout, err.open("w") as stderr:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "laminar_cli.main", *argv],
            stdout=stdout,
            stderr=stderr,
            preexec_fn=_in_the_foreground,
        )
    try:
        wait_for(lambda: out.read_text().endswith("\n"))
        job_id = out.read_text().strip()
        wait_for(lambda: _state(cli.address, job_id).state == zone_pb2.JOB_RUNNING)
        waiter.send_signal(signal.SIGINT)
        assert waiter.wait(30) == 130, err.read_text()
        assert f"{job_id} keeps running" in err.read_text()
        assert _state(cli.address, job_id).state == zone_pb2.JOB_RUNNING
        gate.touch()
        assert cli("watch", job_id)[0] == 0  # it ran on to its end
    finally:
        if waiter.poll() is None:
            waiter.kill()
            waiter.wait(10)
        gate.touch()


def test_forwarded_job_is_followed_to_the_peer_zone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A router with no agents forwards work to its peer; job, watch, logs and
    submit --wait follow it there."""
    with LocalCluster(tmp_path) as cluster:
        launch(
            cluster,
            agents=1,
            fake_gpus=["2xA100-40GB"],
            zones=2,
            heartbeat_seconds=HEARTBEAT_SECONDS,
        )
        working, empty = cluster.zones
        cli = Cli(empty.address, capsys)
        forwarded: list[tuple[str, str]] = []  # (job id, request id)
        argv = ["--gpus", "1", *_py("print('ran in the other zone')")]
        tries: list[str] = []

        def submit_until_forwarded() -> bool:
            # Flow splitting is random (weight 1 here against 3 there) and needs a fresh
            # peer summary first, so submit until one job goes to the peer.
            tries.append(f"forwarded-{len(tries)}")
            job_id = cli.submit("--request-id", tries[-1], *argv)
            if _state(empty.address, job_id).state == zone_pb2.FORWARDED:
                forwarded.append((job_id, tries[-1]))
            return bool(forwarded)

        wait_for(submit_until_forwarded)
        [(origin_id, request_id)] = forwarded
        # The same request again, with --wait: SubmitAndWatch streams the job made before,
        # which ends here at FORWARDED; the CLI follows it to the peer until it succeeds.
        again = ["--request-id", request_id, *argv]
        code, out, err = cli("submit", "--wait", *again)
        assert code == 0 and out.strip() == origin_id, (out, err)
        final = cli.json("submit", "--wait", *again)
        assert final["state"] == "JOB_SUCCEEDED" and final["zone"] == "zone-1", final
        code, out, _ = cli("watch", origin_id)
        assert code == 0 and "forwarded to zone zone-1" in out, out
        job = cli.json("job", origin_id)
        assert job["state"] == "JOB_SUCCEEDED" and job["zone"] == "zone-1"
        assert job["job_id"] != origin_id and job["placements"][0]["agent_id"] == "host-0"
        assert f"{origin_id} was forwarded by zone zone-2" in cli.ok("job", origin_id)
        assert cli.ok("logs", origin_id) == "ran in the other zone\n"
        assert working.address != empty.address


def test_the_example_atomized_job_file_runs_in_pieces(cli: Cli) -> None:
    repo = Path(__file__).parents[2]
    job_id = cli.submit(
        "-f", str(repo / "docs" / "examples" / "atomized.toml"), "--workdir", str(repo)
    )
    code, out, _ = cli("watch", job_id)
    assert code == 0, out
    job = cli.json("job", job_id)
    assert job["atomization"]["units_done"] == "24"
    pieces = job["placements"]
    assert len(pieces) == 3 and all(p["unit_count"] == "8" for p in pieces)
    assert "24 of 24 done in 3 subjob(s)" in cli.ok("job", job_id)


def test_jobs_sorts_fits_the_terminal_goes_wide_and_drops_headers(
    cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    long_reason = "x" * 300
    # No host has this model (one may join later): they wait in the queue.
    absent = ("--gpus", "1", "--gpu-model", "B200-192GB")
    first = cli.submit("--name", "b-job", *absent, *_py("pass"))
    second = cli.submit("--name", "a-job", *absent, *_py(long_reason))
    wait_for(lambda: _state(cli.address, second).state == zone_pb2.QUEUED)
    table = cli.ok("jobs", "--state", "queued")
    assert max(len(line) for line in table.splitlines()) <= 100, table  # cut, not wrapped
    assert "…" in table  # with an ellipsis
    rows = cli.ok("jobs", "--state", "queued", "--no-headers", "--sort", "name")
    ids = [line.split()[0] for line in rows.splitlines() if line.strip()]
    assert ids.index(second) < ids.index(first)  # a-job before b-job
    assert "job" not in rows.split()[0]  # no header row
    wide = cli.ok("jobs", "--state", "queued", "-o", "wide")
    assert "retries" in wide and "expected start" in wide
    code, _, err = cli("jobs", "--sort", "colour")
    assert code == 2 and "--sort" in err and len(err.strip().splitlines()) == 1
    for job_id in (first, second):
        cli.ok("cancel", job_id)


def test_an_array_runs_every_index_and_sums_up(cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "array"
    out.mkdir()
    code = (
        "import os, pathlib; "
        f"pathlib.Path({str(out)!r}, os.environ['LAMINAR_ARRAY_INDEX'])"
        ".write_text(os.environ['LAMINAR_ARRAY_JOB_ID'])"
    )
    array_id = cli.submit("--gpus", "1", "--array", "0-10:2%2", *_py(code))
    status, watched, _ = cli("watch", array_id)
    assert status == 0, watched
    assert "succeeded" in watched.splitlines()[-1]
    assert sorted(int(p.name) for p in out.iterdir()) == [0, 2, 4, 6, 8, 10]
    assert {p.read_text() for p in out.iterdir()} == {array_id}
    array = cli.json("job", array_id)
    assert array["state"] == "JOB_SUCCEEDED"
    assert array["array"]["total"] == 6 and array["array"]["succeeded"] == 6
    element = cli.json("job", f"{array_id}_4")
    assert element["array_id"] == array_id and element["array_index"] == 4
    assert element["state"] == "JOB_SUCCEEDED"
    assert "6 elements, at most 2 at once" in cli.ok("job", array_id)


def test_a_bad_array_is_one_line_naming_the_flag(cli: Cli) -> None:
    status, out, err = cli("submit", "--array", "9-1", *_py("pass"))
    assert status == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "--array" in err and "must go up" in err


def test_more_gpus_than_any_host_has_is_refused_naming_the_flag(cli: Cli) -> None:
    status, out, err = cli("submit", "--gpus", "3", *_py("pass"))  # host-a has 2
    assert status == 2 and not out
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("laminar: --gpus: ") and "largest host" in err and "has 2" in err


def test_a_mig_profile_no_gpu_has_is_refused_naming_the_flag(cli: Cli) -> None:
    """`--mig 9g.99gb` used to be accepted and wait for ever ("0 of 2 hosts match")."""
    status, out, err = cli("submit", "--mig", "9g.99gb", *_py("pass"))
    assert status == 2 and not out
    assert len(err.strip().splitlines()) == 1 and err.startswith("laminar: --mig: "), err


def test_a_gang_the_zone_cannot_hold_even_idle_says_so_at_submit(cli: Cli) -> None:
    # Three whole GPUs at once; the zone has two (host-a), and host-b only MIG slices.
    status, out, err = cli("submit", "--gang", "3", "--gpus", "1", *_py("pass"))
    try:
        assert status == 0 and out.strip().startswith("j-") and len(out.splitlines()) == 1
        assert len(err.strip().splitlines()) == 1, err
        assert err.startswith(f"laminar: {out.strip()} waits: "), err
        assert "even when idle" in err and "hold 2 of 3" in err and "[too_large]" in err
        assert cli.json("job", out.strip())["reason_code"] == "REASON_TOO_LARGE"
    finally:
        if out.strip():
            cli.ok("cancel", out.strip())


def test_jobs_watch_lists_again_until_interrupted(cli: Cli, tmp_path: Path) -> None:
    """`laminar jobs --state S --tenant T --watch N -o wide --no-headers --sort FIELD`, the
    issue's whole line: a job submitted after the watch began shows up in a later listing,
    Ctrl-C ends it with 130."""
    out = tmp_path / "watch.out"
    argv = ["--zone", cli.address, "jobs", "--state", "queued", "--tenant", "watcher"]
    argv += ["--watch", "0.2", "-o", "wide", "--no-headers", "--sort", "age"]
    with out.open("w") as sink:
        watcher = subprocess.Popen(
            [sys.executable, "-m", "laminar_cli.main", *argv],
            stdout=sink,
            stderr=sink,
            preexec_fn=_in_the_foreground,
        )
    submitted: list[str] = []
    try:
        absent = ("--gpus", "1", "--gpu-model", "B200-192GB")  # waits: no host has it
        other = cli.submit("--tenant", "someone-else", *absent, *_py("pass"))
        submitted.append(other)
        mine = cli.submit("--tenant", "watcher", *absent, *_py("pass"))
        submitted.append(mine)
        wait_for(lambda: mine in out.read_text())
        assert other not in out.read_text()  # --tenant
        assert "job" not in out.read_text().split()  # --no-headers
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(30) == 130, out.read_text()
    finally:
        if watcher.poll() is None:
            watcher.kill()
            watcher.wait(10)
        for job_id in submitted:
            cli.ok("cancel", job_id)
