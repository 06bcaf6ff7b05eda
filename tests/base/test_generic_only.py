"""Servicers added through ``generic_only``: every method still answers (a Zone method, the
health check and reflection), served by the generic handler, and the per-method
registration grpc.aio would keep one request-call task for is left out."""

from __future__ import annotations

from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.grpcutil import add_health_and_reflection, generic_only


class _Zone(zone_pb2_grpc.ZoneServicer):
    async def GetJob(self, request: zone_pb2.GetJobRequest, context: Any) -> zone_pb2.Job:
        return zone_pb2.Job(job_id=request.job_id, reason="served")


class _Recorder:
    def __init__(self) -> None:
        self.generic: list[object] = []
        self.registered: list[str] = []

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        self.generic.append(handlers)

    def add_registered_method_handlers(self, service: str, handlers: object) -> None:
        self.registered.append(service)


def test_only_the_generic_handler_is_added() -> None:
    recorder = _Recorder()
    zone_pb2_grpc.add_ZoneServicer_to_server(_Zone(), generic_only(recorder))  # type: ignore[abstract, arg-type]
    assert len(recorder.generic) == 1
    assert recorder.registered == []


async def test_methods_health_and_reflection_answer_through_generic_handlers() -> None:
    server = grpc.aio.server()
    zone_pb2_grpc.add_ZoneServicer_to_server(_Zone(), generic_only(server))  # type: ignore[abstract]
    health = add_health_and_reflection(server, ["laminar.v1.Zone"])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        await health.set("", health_pb2.HealthCheckResponse.SERVING)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            job = await zone_pb2_grpc.ZoneStub(channel).GetJob(
                zone_pb2.GetJobRequest(job_id="j-1"), timeout=10
            )
            assert (job.job_id, job.reason) == ("j-1", "served")
            status = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=10
            )
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            call = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                timeout=10
            )
            await call.write(reflection_pb2.ServerReflectionRequest(list_services=""))
            reply = await call.read()
            await call.done_writing()
            names = {s.name for s in reply.list_services_response.service}
            assert "laminar.v1.Zone" in names
            assert "grpc.health.v1.Health" in names
            # A method the servicer does not implement still answers UNIMPLEMENTED.
            try:
                await zone_pb2_grpc.ZoneStub(channel).CancelJob(
                    zone_pb2.CancelJobRequest(job_id="j-1"), timeout=10
                )
            except grpc.aio.AioRpcError as exc:
                assert exc.code() == grpc.StatusCode.UNIMPLEMENTED
            else:
                raise AssertionError("CancelJob answered without a handler")
    finally:
        await server.stop(None)
