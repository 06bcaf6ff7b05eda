"""Daemon start-up around trust, in process: the unauthenticated warning, debug-call gating,
and bad security config exiting 2 with the key named."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import grpc
import pytest
from loopkit import agent_config

from laminar_agent import __main__ as agent_main
from laminar_agent.config import AgentConfig
from laminar_agent.inventory.base import GpuBackend
from laminar_agent.inventory.fake import FakeGpuBackend
from laminar_agent.server import AgentServer
from laminar_api.v1 import agent_pb2, agent_pb2_grpc
from laminar_base.configlib import load_config
from laminar_base.security import write_file
from laminar_cli.certs import init_certs
from laminar_zone import __main__ as zone_main
from laminar_zone.config import ZoneConfig
from laminar_zone.server import ZoneServer

WARNING = "control calls are unauthenticated"


class RealLikeBackend:
    """A GPU backend that is not the fake one (as NVML would be), over fake GPUs."""

    name = "real-like"

    def __init__(self, fake: FakeGpuBackend) -> None:
        self._fake = fake
        self.frees_memory_on_suspend = fake.frees_memory_on_suspend

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._fake, attribute)


async def inject(server: AgentServer) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(server.address) as channel:
        try:
            reply = await agent_pb2_grpc.AgentStub(channel).InjectLoad(
                agent_pb2.InjectLoadRequest(gpu_index=0, used_bytes=1 << 30), timeout=5
            )
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, str(reply.injected_bytes)


async def run_agent(config: AgentConfig, backend: GpuBackend | None = None) -> tuple[Any, ...]:
    server = AgentServer(config, backend=backend)
    await server.start()
    try:
        return await inject(server)
    finally:
        await server.stop()


async def test_agent_without_tls_or_secret_warns_and_fake_backend_serves_injection(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="laminar.agent"):
        code, injected = await run_agent(agent_config(tmp_path))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert any(WARNING in r.getMessage() for r in warnings), caplog.text
    assert "shared_secret_file" in caplog.text and "tls.ca_file" in caplog.text
    assert code == grpc.StatusCode.OK and int(injected) == 1 << 30


async def test_injection_is_refused_on_a_real_backend_without_the_debug_flag(
    tmp_path: Path,
) -> None:
    real = RealLikeBackend(FakeGpuBackend("1xA100-40GB", agent_id="inproc"))
    code, details = await run_agent(agent_config(tmp_path), backend=real)  # type: ignore[arg-type]
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "server.debug_rpcs" in details and "--debug-rpcs" in details
    # With the flag the call is let through, and says what this backend lacks.
    real = RealLikeBackend(FakeGpuBackend("1xA100-40GB", agent_id="inproc"))
    code, details = await run_agent(
        agent_config(tmp_path, **{"server.debug_rpcs": True}),
        backend=real,  # type: ignore[arg-type]
    )
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert "inventory.gpu_backend" in details and "real-like" in details


async def test_zone_warns_without_trust_and_not_with_a_secret(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    secret = tmp_path / "secret"
    write_file(secret, b"zone-secret\n", 0o600)
    for name, extra, warned in (
        ("open", {}, True),
        ("guarded", {"control.shared_secret_file": str(secret)}, False),
    ):
        caplog.clear()
        config = load_config(
            ZoneConfig,
            overrides={
                "server.listen": "127.0.0.1:0",
                "server.state_dir": str(tmp_path / name),
                **extra,
            },
        )
        server = ZoneServer(config)
        with caplog.at_level(logging.INFO, logger="laminar.zone"):
            await server.start()
            await server.stop()
        assert any(WARNING in r.getMessage() for r in caplog.records) is warned, caplog.text
        if not warned:
            assert "authenticated by shared secret" in caplog.text


def test_bad_security_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    certs = tmp_path / "certs"
    init_certs(certs, ["agent"])
    base = ["--listen", "127.0.0.1:0", "--state-dir", str(tmp_path / "s")]
    cases: list[tuple[Any, list[str], str]] = [
        (agent_main, ["--tls-ca-file", str(tmp_path / "missing.pem")], "tls.ca_file"),
        (agent_main, ["--tls-ca-file", str(certs / "ca.pem")], "tls.cert_file"),
        (
            zone_main,
            [
                "--tls-ca-file",
                str(certs / "ca.pem"),
                "--tls-cert-file",
                str(certs / "agent.pem"),
                "--tls-key-file",
                str(tmp_path / "nokey.pem"),
            ],
            "tls.key_file",
        ),
        (zone_main, ["--shared-secret-file", str(tmp_path / "nosecret")], "shared_secret_file"),
        (zone_main, ["--tls-allowed-names", "router"], "tls.allowed_names"),
    ]
    for module, argv, key in cases:
        assert module.main([*base, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert f"{key}:" in err, err


async def test_a_secret_readable_by_others_or_a_non_pem_file_is_refused_at_start(
    tmp_path: Path,
) -> None:
    from laminar_base.errors import ConfigError

    secret = tmp_path / "secret"
    write_file(secret, b"s\n", 0o644)
    server = AgentServer(agent_config(tmp_path, **{"control.shared_secret_file": str(secret)}))
    with pytest.raises(ConfigError, match=r"control\.shared_secret_file: .*readable by others"):
        await server.start()
    write_file(secret, b"\xff\xfe binary\n", 0o600)  # metadata must be printable ASCII
    server = AgentServer(agent_config(tmp_path, **{"control.shared_secret_file": str(secret)}))
    with pytest.raises(ConfigError, match=r"control\.shared_secret_file: .*printable ASCII"):
        await server.start()
    not_pem = tmp_path / "ca.txt"
    not_pem.write_text("not a certificate\n")
    certs = tmp_path / "certs"
    init_certs(certs, ["agent"])
    server = AgentServer(
        agent_config(
            tmp_path,
            **{
                "tls.ca_file": str(not_pem),
                "tls.cert_file": str(certs / "agent.pem"),
                "tls.key_file": str(certs / "agent-key.pem"),
            },
        )
    )
    with pytest.raises(ConfigError, match=r"tls\.ca_file: .* not a PEM file"):
        await server.start()
