"""Limits hold without authentication too: jobs that name no tenant are the default
tenant's, at admission as in the queue."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_zone.auth import DEFAULT_TENANT, open_guard


def test_an_unnamed_tenant_is_the_default_one_when_nobody_authenticates() -> None:
    guard = open_guard()
    assert guard.submit_tenant(None, "") == DEFAULT_TENANT
    assert guard.submit_tenant(None, "alice") == "alice"


def test_the_queued_job_cap_holds_for_jobs_that_name_no_tenant(tmp_path: Path) -> None:
    with LocalCluster(tmp_path) as cluster:
        cluster.env["LAMINAR_LIMITS_MAX_QUEUED_PER_TENANT"] = "2"
        zone = cluster.start_zone("z")  # no agents: every job waits
        spec = zone_pb2.JobSpec(command=["true"], resources=common_pb2.Resources(gpus=1))
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            for _ in range(2):
                stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
            with pytest.raises(grpc.RpcError) as err:
                stub.Submit(zone_pb2.SubmitRequest(spec=spec), timeout=10)
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert DEFAULT_TENANT in (err.value.details() or "")
