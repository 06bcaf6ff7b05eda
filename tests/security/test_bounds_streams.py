"""Issue 13, item 6: revoking a token (SIGHUP with the token gone) used to leave the
tenant's open streams running. A revoked token now ends its Bid stream as it ends a
Watch stream (test_control.py), with UNAUTHENTICATED; the job and the other tenant
are untouched."""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
from waiting import wait_for

from laminar_api.v1 import common_pb2, zone_pb2, zone_pb2_grpc
from laminar_cli.cluster import LocalCluster
from laminar_zone.auth import hash_token

TOKENS = {
    "alice": "alice-token-0123456789",
    "bob": "bob-token-0123456789",
    "ops": "ops-token-0123456789",
}
GIB = 1024**3


def _write_tokens(path: Path, tenants: list[str]) -> None:
    path.write_text(
        "".join(
            f'[[token]]\ntenant = "{t}"\nrole = "{"admin" if t == "ops" else "tenant"}"\n'
            f'hash = "{hash_token(TOKENS[t])}"\n'
            for t in tenants
        )
    )


def _meta(tenant: str) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {TOKENS[tenant]}")]


def test_a_revoked_token_ends_its_bid_stream(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.toml"
    _write_tokens(tokens, ["alice", "bob", "ops"])
    config = tmp_path / "zone.toml"
    config.write_text(f'[auth]\ntokens_file = "{tokens}"\n')
    with LocalCluster(tmp_path / "run") as cluster:
        zone = cluster.start_zone("z", extra_args=["--config", str(config)])  # no agent
        with grpc.insecure_channel(zone.address) as channel:
            stub = zone_pb2_grpc.ZoneStub(channel)
            contract = common_pb2.AtomizationContract(
                total_units=4,
                seconds_per_unit=[common_pb2.Quantile(q=0.95, value=0.1)],
                peak_memory_bytes=[common_pb2.Quantile(q=0.95, value=GIB)],
                checkpoint_dir=str(tmp_path / "ckpt"),
            )
            spec = zone_pb2.JobSpec(
                command=[sys.executable, "-c", "pass"],
                resources=common_pb2.Resources(gpus=1),
                atomization=contract,
            )
            job = stub.Submit(
                zone_pb2.SubmitRequest(spec=spec), metadata=_meta("alice"), timeout=10
            )
            requests: queue.Queue[zone_pb2.BidMessage | None] = queue.Queue()
            requests.put(zone_pb2.BidMessage(job_id=job.job_id))

            def outgoing() -> Iterator[zone_pb2.BidMessage]:
                while (message := requests.get()) is not None:
                    yield message

            stream = stub.Bid(outgoing(), metadata=_meta("alice"), timeout=60)
            ended: list[grpc.StatusCode] = []
            announced: list[zone_pb2.AnnounceMessage] = []

            def read() -> None:
                try:
                    for announce in stream:
                        announced.append(announce)
                    ended.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    ended.append(exc.code())

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            wait_for(lambda: bool(announced or ended))  # attached: the router announces
            assert not ended
            _write_tokens(tokens, ["bob", "ops"])  # alice's token is revoked
            os.kill(zone.process.pid, signal.SIGHUP)
            wait_for(lambda: bool(ended))
            requests.put(None)
            assert ended == [grpc.StatusCode.UNAUTHENTICATED]
            # the router is healthy and lost nothing: the job still waits, bob sees none of it
            listed = stub.ListJobs(zone_pb2.ListJobsRequest(), metadata=_meta("bob"), timeout=10)
            assert list(listed.jobs) == []
            kept = stub.GetJob(
                zone_pb2.GetJobRequest(job_id=job.job_id), metadata=_meta("ops"), timeout=10
            )
            assert kept.state == zone_pb2.QUEUED
