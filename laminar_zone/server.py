"""laminar-zone lifecycle: journal recovery -> bind gRPC -> health SERVING -> READY=1 -> root tasks.

Root tasks: the tick (staleness sweep, watchdog), the queue pass loop and the
peer summary exchange. Signal handlers only set an event; a second signal
forces exit. Shutdown: STOPPING=1 -> health NOT_SERVING -> stop accepting
(grace) -> cancel root tasks -> close the journal. Jobs and the queue stay in
the journal; running subjobs are untouched (agents own them).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
import logging
import os
import signal
from pathlib import Path
from typing import Any

import grpc
from prometheus_client import start_http_server

from laminar_api.v1 import zone_pb2, zone_pb2_grpc
from laminar_base.daemon import prepare_state_dir, serve_until_signalled
from laminar_base.grpcutil import add_health_and_reflection, server_options, set_serving
from laminar_base.sdnotify import Notifier
from laminar_base.security import check_exposure, load_trust, log_trust, server_interceptors
from laminar_zone.audit import AUDIT_FILE, AuditLog
from laminar_zone.auth import Guard, open_guard
from laminar_zone.config import ZoneConfig
from laminar_zone.jobs import ZoneState
from laminar_zone.limits import RateLimiter
from laminar_zone.metrics import ZoneMetrics
from laminar_zone.peers import PeerRouter
from laminar_zone.service import ZoneControlService, ZoneService
from laminar_zone.store import JobStore

log = logging.getLogger("laminar.zone")

CONTROL_SERVICE = zone_pb2.DESCRIPTOR.services_by_name["ZoneControl"].full_name
SERVICE_NAMES = [zone_pb2.DESCRIPTOR.services_by_name["Zone"].full_name, CONTROL_SERVICE]
#: Under mTLS, who may make which control call (certificate roles, docs/security.md): only
#: an agent heartbeats; only a peer zone exchanges summaries and forwards jobs.
CONTROL_ROLES = {
    f"/{CONTROL_SERVICE}/Heartbeat": {"agent"},
    f"/{CONTROL_SERVICE}/ExchangeSummary": {"peer"},
    f"/{CONTROL_SERVICE}/ForwardJob": {"peer"},
}
#: The calls only a peer zone makes: with control.peer_secret_file they need that secret.
PEER_METHODS = [m for m, roles in CONTROL_ROLES.items() if roles == {"peer"}]


class Status(enum.Enum):
    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class ZoneServer:
    def __init__(self, config: ZoneConfig, *, notifier: Notifier | None = None) -> None:
        self.config = config
        self.notifier = notifier or Notifier(None)
        self.status = Status.CREATED
        self.stop_event = asyncio.Event()
        self.address = ""
        self.metrics_address = ""
        self.state: ZoneState | None = None
        self.peers: PeerRouter | None = None
        self.guard: Guard = open_guard()
        self._server: grpc.aio.Server | None = None
        self._metrics_http: Any = None
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        self.status = Status.STARTING
        cfg = self.config
        trust = load_trust(cfg.tls, cfg.control)
        check_exposure(
            trust,
            cfg.server.listen,
            insecure=cfg.control.insecure,
            tokens_file=cfg.auth.tokens_file,
        )
        state_dir = prepare_state_dir(Path(cfg.server.state_dir))
        store = JobStore(state_dir / "zone.db")
        metrics = ZoneMetrics()
        self.state = ZoneState(cfg, store, metrics, trust=trust)
        self.state.audit = AuditLog(state_dir / AUDIT_FILE)
        recovered = self.state.recover()
        log.info("journal recovery: %d live job(s) reloaded from %s", recovered, store.path)
        self.peers = PeerRouter(self.state, cfg.peers, trust.for_peers())
        self.state.forwarder = self.peers.forward
        self.state.resume_forwards(self.peers.resume_forward)
        self.guard = Guard(
            cfg.auth.tokens_file,
            submit_limiter=RateLimiter("Submit", cfg.limits.submit_per_second, cfg.limits.burst),
            probe_limiter=RateLimiter("ProbeJob", cfg.limits.probe_per_second, cfg.limits.burst),
            max_queued_per_tenant=cfg.limits.max_queued_per_tenant,
        )
        if self.guard.table is None:
            log.warning(
                "no auth.tokens_file: submitters are not authenticated; any caller may act on "
                "any job (fine for a local cluster, not for a shared fleet)"
            )
        else:
            log.info(
                "submitter auth on: %d token(s) from %s",
                len(self.guard.table),
                cfg.auth.tokens_file,
            )
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self.reload_tokens)
        # With mTLS every caller needs a CA-signed certificate, submitters included; the
        # shared secret guards ZoneControl only (submitters use bearer tokens).
        server = grpc.aio.server(
            options=server_options(cfg.server.max_message_bytes),
            interceptors=server_interceptors(trust, [CONTROL_SERVICE], CONTROL_ROLES, PEER_METHODS),
        )
        submitters = ZoneService(self.state, self.guard)
        zone_pb2_grpc.add_ZoneServicer_to_server(submitters, server)
        zone_pb2_grpc.add_ZoneControlServicer_to_server(
            ZoneControlService(self.state, self.peers, submitters), server
        )
        health = add_health_and_reflection(server, SERVICE_NAMES)
        port = trust.bind(server, cfg.server.listen)
        if port == 0:
            raise OSError(f"cannot bind gRPC address {cfg.server.listen}")
        host = cfg.server.listen.rpartition(":")[0]
        self.address = f"{host}:{port}"
        self.peers.address = self.address
        await server.start()
        self._server = server
        self._health = health
        await set_serving(health, SERVICE_NAMES, True)
        if cfg.server.metrics_listen:
            mhost, _, mport = cfg.server.metrics_listen.rpartition(":")
            httpd, _thread = start_http_server(int(mport), addr=mhost, registry=metrics.registry)
            self._metrics_http = httpd
            self.metrics_address = f"{mhost}:{httpd.server_port}"
        self._write_addresses(state_dir)
        log.info(
            "zone %s listening on %s (metrics %s, peers %s)",
            cfg.server.zone_name,
            self.address,
            self.metrics_address or "off",
            ",".join(cfg.peers.peers) or "none",
        )
        log_trust(log, trust, "zone router", self.address)
        self._tasks = [
            asyncio.create_task(self._tick(), name="zone-tick"),
            asyncio.create_task(self.state.run_queue(self.stop_event), name="zone-queue"),
            asyncio.create_task(self.state.atomizer.run(self.stop_event), name="zone-market"),
            asyncio.create_task(self.peers.run(self.stop_event), name="zone-peers"),
        ]
        self.status = Status.RUNNING
        self.notifier.notify("READY=1", f"STATUS=serving on {self.address}")

    def _write_addresses(self, state_dir: Path) -> None:
        info = {
            "zone": self.config.server.zone_name,
            "address": self.address,
            "metrics_address": self.metrics_address,
            "pid": os.getpid(),
        }
        tmp = state_dir / "zone.json.tmp"
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        tmp.replace(state_dir / "zone.json")

    async def _tick(self) -> None:
        """Staleness sweep once per heartbeat period; systemd watchdog from the event loop."""
        assert self.state is not None
        loop = asyncio.get_running_loop()
        interval = self.notifier.watchdog_interval_seconds
        period = min(self.config.membership.heartbeat_seconds, 1.0)
        last_watchdog = 0.0
        while not self.stop_event.is_set():
            try:
                self.state.sweep()
            except Exception:
                log.exception("membership sweep failed")
            if interval is not None and loop.time() - last_watchdog >= interval:
                self.notifier.notify("WATCHDOG=1")
                last_watchdog = loop.time()
            try:
                await asyncio.wait_for(self.stop_event.wait(), period)
            except TimeoutError:
                pass

    def reload_tokens(self) -> None:
        """SIGHUP: reread the tokens file; running work and connections are untouched."""
        applied, what = self.guard.reload()
        (log.info if applied else log.warning)("SIGHUP: %s", what)

    async def stop(self) -> None:
        self.status = Status.DRAINING
        self.notifier.notify("STOPPING=1")
        if self._server is not None:
            await set_serving(self._health, SERVICE_NAMES, False)
            await self._server.stop(self.config.server.grace_seconds)
        self.stop_event.set()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.state is not None:
            await self.state.close()
            self.state.store.close()
        if self.peers is not None:
            await self.peers.close()
        if self._metrics_http is not None:
            self._metrics_http.shutdown()
        self.status = Status.STOPPED
        log.info("zone stopped")

    async def run_until_signalled(self) -> None:
        await serve_until_signalled(
            self.start, self.stop, self.stop_event, log, "jobs stay in the journal"
        )
