"""`systemctl reload laminar-zone` sends SIGHUP: the router rereads its config, applies the
reloadable keys, names the ones that need a restart, and does not die (issue 19)."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster


def _reload_line(log: Path, nth: int) -> str:
    lines = [x for x in log.read_text().splitlines() if "SIGHUP: config" in x]
    return lines[nth] if len(lines) > nth else ""


def test_sighup_applies_limits_names_the_rest_and_survives_a_bad_file(tmp_path: Path) -> None:
    config = tmp_path / "zone.toml"
    config.write_text("[limits]\nsubmit_per_second = 0\n")
    spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("z", extra_args=["--config", str(config)])
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            for _ in range(3):  # unlimited
                stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)  # queues: no agents
            config.write_text(
                "[limits]\nsubmit_per_second = 0.001\nburst = 1\n[placement]\nmax_attempts = 9\n"
            )
            zone.process.send_signal(signal.SIGHUP)
            wait_for(lambda: _reload_line(zone.log_path, 0) != "")
            line = _reload_line(zone.log_path, 0)
            assert "applied limits.submit_per_second, limits.burst;" in line, line
            assert "need a restart: placement.max_attempts;" in line, line
            assert "no auth.tokens_file configured" in line, line
            # The new limit holds at once: one submit (the burst), then the next is refused
            # (a token comes back only after 1000 s).
            stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
            try:
                stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
                raise AssertionError("a second submit passed burst = 1 at 0.001/s")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            config.write_text("[limits]\nburst = 0\n")  # invalid: refused, the router stays
            zone.process.send_signal(signal.SIGHUP)
            wait_for(lambda: "config not reloaded" in zone.log_path.read_text())
            assert "limits.burst" in zone.log_path.read_text().rsplit("config not", 1)[1]
            assert zone.is_running()
            reply = stub.ListJobs(zone_pb2.ListJobsRequest(), timeout=10)
            assert len(reply.jobs) == 4  # the queue is untouched
